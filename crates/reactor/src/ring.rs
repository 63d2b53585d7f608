//! The reactor's io_uring: submission with a completion handler per entry, batched submits,
//! and the sleep that waits for a completion, the doorbell or a timeout.
//!
//! An entry's `user_data` names its handler slot and the slot's generation (`slot | gen << 32`):
//! a cancel by `user_data` queued for an operation that has meanwhile completed cannot hit a
//! later operation that reuses the slot. A multishot entry (a CQE with `IORING_CQE_F_MORE`
//! promises more) keeps its slot and handler until the CQE without that flag.

use io_uring::{cqueue, opcode, squeue, types, IoUring};
use std::rc::Rc;
use std::time::Duration;

/// Receives the completion of an entry pushed with [`Ring::push`].
pub trait CqeHandler {
    /// Called on the reactor that pushed the entry, with the tag given at push time and the
    /// kernel's result (a byte count or a negated errno).
    fn complete(&self, tag: u64, result: i32);

    /// Called for every completion with the CQE's flags (`IORING_CQE_F_*`: the provided buffer
    /// used, `MORE` for a multishot entry that stays armed). The default ignores the flags and
    /// calls [`CqeHandler::complete`]; handlers of multishot or buffer-select entries override it.
    fn complete_flags(&self, tag: u64, result: i32, flags: u32) {
        let _ = flags;
        self.complete(tag, result)
    }
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
/// Fixed-buffer slots of the buffer pool's registered classes (slots 0 and 1); external memory
/// ([`crate::FixedMem`]) takes slots after them.
pub const POOL_BUF_SLOTS: u32 = 2;
/// Upper bound of a ring's fixed-buffer table (the kernel's own limit, `IORING_MAX_REG_BUFFERS`).
pub const MAX_BUF_SLOTS: u32 = 1 << 14;
/// Upper bound of the completion queue size asked from the kernel (its own limit is 2^17 on
/// current kernels; the ring falls back to the default if refused).
const MAX_CQ_ENTRIES: u32 = 1 << 16;

struct Slot {
    handler: Option<Rc<dyn CqeHandler>>,
    tag: u64,
    /// Completed by an io-wq worker thread rather than inline or by an interrupt.
    worker: bool,
    /// Bumped each time the slot is taken; the high half of the entry's `user_data`.
    gen: u32,
}

impl Slot {
    const fn empty() -> Self {
        Self { handler: None, tag: 0, worker: false, gen: 0 }
    }
}

/// The `user_data` of the entry in `slot` at generation `gen`.
fn token(slot: u32, gen: u32) -> u64 {
    (gen as u64) << 32 | slot as u64
}

/// The opcode of a built entry (its first byte).
fn opcode_of(e: &squeue::Entry) -> u8 {
    // SAFETY: `squeue::Entry` is `#[repr(C)]` around the kernel's `io_uring_sqe`, whose first
    // field is the one-byte opcode (checked by a unit test below).
    unsafe { *(e as *const squeue::Entry as *const u8) }
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
    /// The fixed-buffer table is sparse (Linux 5.19): the pool's slots and external memory are
    /// updated in place. Without it the pool's regions are the whole table and external memory
    /// is not registered.
    sparse_bufs: bool,
    /// External slots (after [`POOL_BUF_SLOTS`]) in use.
    ext_used: Vec<bool>,
    /// Entries pushed with `READ_FIXED` or `WRITE_FIXED`.
    fixed_ops: u64,
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
        // Deferred task running: the kernel runs the work that completes socket operations
        // (a multishot receive's reads) only when this thread enters asking for events, not
        // on every enter, so the reactor decides how often its sockets are read (see
        // `run_task_work`). Needs a single issuer and Linux 6.1; older kernels get the
        // cooperative mode below.
        let ring = IoUring::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_taskrun_flag()
            .setup_cqsize(cq)
            .build(entries)
            .or_else(|_| {
                IoUring::builder()
                    .setup_single_issuer()
                    .setup_coop_taskrun()
                    .setup_taskrun_flag()
                    .setup_cqsize(cq)
                    .build(entries)
            })
            .or_else(|_| IoUring::builder().setup_cqsize(cq).build(entries))
            .or_else(|_| IoUring::new(entries))?;
        let mut r = Self {
            ring,
            slots: (0..handlers).map(|_| Slot::empty()).collect(),
            free: (0..handlers as u32).rev().collect(),
            in_flight: 0,
            pending: 0,
            doorbell_fd,
            doorbell_armed: false,
            doorbell_buf: Box::new(0),
            free_files: Vec::new(),
            worker_ops: 0,
            sparse_bufs: false,
            ext_used: Vec::new(),
            fixed_ops: 0,
            enters: 0,
        };
        if r.ring.submitter().register_files_sparse(FILE_SLOTS).is_ok() {
            r.free_files = (0..FILE_SLOTS).rev().collect();
        }
        r.arm_doorbell();
        Ok(r)
    }

    /// Makes the fixed-buffer table: a sparse one of [`POOL_BUF_SLOTS`] + `ext_slots` entries
    /// (clamped to [`MAX_BUF_SLOTS`]), or, on a kernel without sparse tables (before 5.19), none
    /// yet (the pool's regions then become the whole table, and external memory stays
    /// unregistered). Call once, before [`Ring::set_pool_buffers`].
    pub fn init_buffer_table(&mut self, ext_slots: u32) {
        let total = POOL_BUF_SLOTS.saturating_add(ext_slots).min(MAX_BUF_SLOTS);
        match self.ring.submitter().register_buffers_sparse(total) {
            Ok(()) => {
                self.sparse_bufs = true;
                self.ext_used = vec![false; (total - POOL_BUF_SLOTS) as usize];
            }
            Err(e) => log::debug!("sparse fixed-buffer table refused ({e}); external memory stays unregistered"),
        }
    }

    /// Registers the buffer pool's regions as fixed buffers 0 and 1 (index = position in
    /// `regions`, at most [`POOL_BUF_SLOTS`]), in place of the pool's earlier ones. Operations
    /// in flight on the earlier regions keep what they use (the kernel holds it until they end).
    pub fn set_pool_buffers(&mut self, regions: &[libc::iovec]) -> std::io::Result<()> {
        assert!(regions.len() <= POOL_BUF_SLOTS as usize, "the pool has {POOL_BUF_SLOTS} fixed-buffer slots");
        if regions.is_empty() {
            return Ok(());
        }
        if self.sparse_bufs {
            // SAFETY: the regions are mappings owned by the reactor's buffer pool, which the
            // reactor keeps until it replaces the pool (and then calls this again) or ends.
            return unsafe { self.ring.submitter().register_buffers_update(0, regions, None) };
        }
        // Not sparse: the table is the pool's alone, replaced whole.
        let _ = self.ring.submitter().unregister_buffers();
        // SAFETY: as above.
        unsafe { self.ring.submitter().register_buffers(regions) }
    }

    /// Registers external memory as `chunks.len()` consecutive fixed buffers after the pool's;
    /// returns the first one's index. Fails without a sparse table, when no run of free slots
    /// is long enough, or when the kernel refuses (`RLIMIT_MEMLOCK`, memory it cannot pin, a
    /// chunk above 1 GiB); nothing stays registered then.
    ///
    /// # Safety
    /// Each chunk must stay mapped until [`Ring::unregister_external`] (or the ring's end).
    pub unsafe fn register_external(&mut self, chunks: &[libc::iovec]) -> std::io::Result<u16> {
        if !self.sparse_bufs {
            return Err(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "no sparse fixed-buffer table (Linux 5.19)",
            ));
        }
        let n = chunks.len();
        let len = self.ext_used.len();
        let first = (n > 0 && n <= len)
            .then(|| (0..=len - n).find(|&i| self.ext_used[i..i + n].iter().all(|used| !used)))
            .flatten()
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::OutOfMemory, "fixed-buffer table full"))?;
        let slot = |i: usize| POOL_BUF_SLOTS + (first + i) as u32;
        // One chunk per update: the kernel reports a partial update only as a count, which the
        // crate drops, so this is how a failure names what to undo.
        for (i, c) in chunks.iter().enumerate() {
            // SAFETY: forwarded from the caller.
            if let Err(e) =
                unsafe { self.ring.submitter().register_buffers_update(slot(i), std::slice::from_ref(c), None) }
            {
                let empty = vec![libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; i];
                if i > 0 {
                    // SAFETY: null entries name no memory: they empty the slots.
                    let _ = unsafe { self.ring.submitter().register_buffers_update(slot(0), &empty, None) };
                }
                return Err(e);
            }
        }
        self.ext_used[first..first + n].iter_mut().for_each(|u| *u = true);
        Ok(slot(0) as u16)
    }

    /// Empties `count` external slots from `first` (as returned by
    /// [`Ring::register_external`]). Operations in flight on them keep the pinned pages until
    /// they end; the slots can be reused at once.
    pub fn unregister_external(&mut self, first: u16, count: u16) {
        let empty = vec![libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; count as usize];
        // SAFETY: null entries name no memory: they empty the slots.
        if let Err(e) = unsafe { self.ring.submitter().register_buffers_update(first as u32, &empty, None) } {
            log::warn!("emptying fixed buffers {first}..+{count} failed: {e}");
        }
        let from = (first as u32).saturating_sub(POOL_BUF_SLOTS) as usize;
        for u in self.ext_used.iter_mut().skip(from).take(count as usize) {
            *u = false;
        }
    }

    /// External fixed-buffer slots in use now.
    pub fn external_slots_used(&self) -> usize {
        self.ext_used.iter().filter(|u| **u).count()
    }

    /// Entries pushed with `READ_FIXED` or `WRITE_FIXED` so far (a module picks those for a
    /// buffer with a fixed index).
    pub fn fixed_ops(&self) -> u64 {
        self.fixed_ops
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
        let code = opcode_of(&e);
        self.fixed_ops += (code == opcode::ReadFixed::CODE || code == opcode::WriteFixed::CODE) as u64;
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
        unsafe { self.push_as(e, handler, tag, false).map(drop) }
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
        unsafe { self.push_as(e, handler, tag, true).map(drop) }
    }

    /// Like [`Ring::push`], returning the entry's `user_data`, which [`Ring::cancel_op`] takes
    /// to end it early. For a multishot entry (e.g. `RecvMulti`) `handler.complete_flags` runs
    /// for each of its completions, and the handler keeps its slot until the completion without
    /// `IORING_CQE_F_MORE`.
    ///
    /// # Safety
    /// As for [`Ring::push`], until the last completion.
    pub unsafe fn push_with_id(
        &mut self,
        e: squeue::Entry,
        handler: Rc<dyn CqeHandler>,
        tag: u64,
    ) -> Result<u64, RingFull> {
        // SAFETY: forwarded from the caller.
        unsafe { self.push_as(e, handler, tag, false) }
    }

    unsafe fn push_as(
        &mut self,
        e: squeue::Entry,
        handler: Rc<dyn CqeHandler>,
        tag: u64,
        worker: bool,
    ) -> Result<u64, RingFull> {
        let user_data = self.take_slot(handler, tag, worker)?;
        if let Err(full) = self.push_raw(e.user_data(user_data)) {
            self.put_slot(user_data as u32);
            return Err(full);
        }
        Ok(user_data)
    }

    /// Takes a free handler slot for `handler`, growing the table if every slot is in use;
    /// returns the `user_data` naming it.
    fn take_slot(&mut self, handler: Rc<dyn CqeHandler>, tag: u64, worker: bool) -> Result<u64, RingFull> {
        if self.free.is_empty() {
            self.grow()?;
        }
        let slot = self.free.pop().ok_or(RingFull)?;
        let s = &mut self.slots[slot as usize];
        let gen = s.gen.wrapping_add(1);
        *s = Slot { handler: Some(handler), tag, worker, gen };
        self.in_flight += 1;
        self.worker_ops += worker as u32;
        Ok(token(slot, gen))
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
        self.slots.resize_with(new, Slot::empty);
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
                self.put_slot(a as u32);
                return Err(full);
            }
        };
        let ea = first.0.user_data(a).flags(squeue::Flags::IO_LINK);
        let eb = second.0.user_data(b);
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
    /// way). The kernel does not interrupt a polling reactor; it raises a flag instead, and an
    /// enter asking for events runs the work (with cooperative task running, the fallback,
    /// any enter does). Returns true if it entered.
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
        let len = self.ring.submission().len() as u32;
        // Without GETEVENTS: deferred task work waits for `run_task_work`.
        // SAFETY: io_uring_enter with no argument, submitting the entries already queued.
        match unsafe { self.ring.submitter().enter::<libc::sigset_t>(len, 0, 0, None) } {
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
            // Most polls find nothing: look before zeroing the batch (512 bytes).
            if this.borrow_mut().ring.completion().is_empty() {
                return total;
            }
            let mut batch: [(u64, i32, u32); 32] = [(0, 0, 0); 32];
            let n = {
                let mut r = this.borrow_mut();
                let mut n = 0;
                for cqe in r.ring.completion() {
                    batch[n] = (cqe.user_data(), cqe.result(), cqe.flags());
                    n += 1;
                    if n == batch.len() {
                        break;
                    }
                }
                n
            };
            // n > 0: the queue held entries, and only this thread takes them.
            total += n;
            for &(token, res, flags) in &batch[..n] {
                if token == DOORBELL_TOKEN {
                    let mut r = this.borrow_mut();
                    r.doorbell_armed = false;
                    r.arm_doorbell();
                    continue;
                }
                let index = token as u32;
                let (handler, tag) = {
                    let mut r = this.borrow_mut();
                    let slot = &mut r.slots[index as usize];
                    debug_assert_eq!(slot.gen, (token >> 32) as u32, "completion for an older use of slot {index}");
                    if cqueue::more(flags) {
                        // A multishot entry stays armed: its handler keeps the slot.
                        let h = slot.handler.clone().expect("completion for an empty ring slot");
                        (h, slot.tag)
                    } else {
                        let h = slot.handler.take().expect("completion for an empty ring slot");
                        let tag = slot.tag;
                        let worker = slot.worker;
                        r.worker_ops -= worker as u32;
                        r.in_flight -= 1;
                        r.free.push(index);
                        (h, tag)
                    }
                };
                handler.complete_flags(tag, res, flags);
            }
        }
    }

    /// Asks the kernel to cancel the one operation whose `user_data` is `user_data` (as returned
    /// by [`Ring::push_with_id`]). It completes with `-ECANCELED` (a multishot one: its final
    /// completion) unless it finished first; `handler` gets the cancel's own result (0, or
    /// `-ENOENT` if nothing matched: the slot's generation keeps a late cancel from matching an
    /// operation that reused the slot).
    pub fn cancel_op(&mut self, user_data: u64, handler: Rc<dyn CqeHandler>, tag: u64) -> Result<(), RingFull> {
        let e = opcode::AsyncCancel::new(user_data).build();
        // SAFETY: a cancel names no memory, only the user_data to match.
        unsafe { self.push(e, handler, tag).map(drop) }
    }

    /// Registers a provided buffer ring (`IORING_REGISTER_PBUF_RING`) of `entries` entries at
    /// `ring_addr` as buffer group `bgid`.
    ///
    /// # Safety
    /// `ring_addr` must be page-aligned memory of `entries` 16-byte entries, and it and every
    /// buffer published in it must stay valid until [`Ring::unregister_buf_ring`] or the ring's
    /// end.
    pub unsafe fn register_buf_ring(&mut self, ring_addr: u64, entries: u16, bgid: u16) -> std::io::Result<()> {
        // SAFETY: forwarded from the caller.
        unsafe { self.ring.submitter().register_buf_ring_with_flags(ring_addr, entries, bgid, 0) }
    }

    /// Unregisters buffer group `bgid`: operations that select from it afterwards fail with
    /// `-ENOBUFS`, and the kernel no longer touches its memory.
    pub fn unregister_buf_ring(&mut self, bgid: u16) -> std::io::Result<()> {
        self.ring.submitter().unregister_buf_ring(bgid)
    }

    /// True if the kernel offers multishot receive (Linux 6.0). `IORING_RECV_MULTISHOT` is a flag
    /// of `IORING_OP_RECV`, which an opcode probe cannot see; `IORING_OP_SEND_ZC` came in the
    /// same release and is probed instead. (A multishot receive refused anyway fails with
    /// `-EINVAL`, which the socket layer also treats as "unsupported".)
    pub fn probe_multishot_recv(&self) -> bool {
        let mut probe = io_uring::Probe::new();
        self.ring.submitter().register_probe(&mut probe).is_ok() && probe.is_supported(opcode::SendZc::CODE)
    }

    /// True if any entry is in flight (other than the doorbell).
    pub fn busy(&self) -> bool {
        self.in_flight > 0
    }
}

pub use io_uring::{opcode as uring_opcode, squeue::Entry as SqEntry, types as uring_types};

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// Records every completion.
    #[derive(Default)]
    struct Log(RefCell<Vec<(u64, i32, bool)>>);

    impl CqeHandler for Log {
        fn complete(&self, _tag: u64, _result: i32) {
            unreachable!("the ring calls complete_flags");
        }
        fn complete_flags(&self, tag: u64, result: i32, flags: u32) {
            self.0.borrow_mut().push((tag, result, cqueue::more(flags)));
        }
    }

    fn eventfd() -> i32 {
        // SAFETY: eventfd with constant flags; checked below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        assert!(fd >= 0);
        fd
    }

    fn kick(fd: i32) {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a local to our eventfd.
        assert_eq!(unsafe { libc::write(fd, &one as *const u64 as *const _, 8) }, 8);
    }

    /// Submits and reaps until `done` holds (at most 2 s).
    fn turn_until(ring: &RefCell<Ring>, done: impl Fn() -> bool) {
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        while !done() {
            assert!(std::time::Instant::now() < deadline, "completions did not arrive");
            ring.borrow_mut().submit();
            ring.borrow_mut().wait(Some(Duration::from_millis(10)));
            Ring::reap(ring);
        }
    }

    #[test]
    fn the_opcode_is_an_entry_s_first_byte() {
        let e = opcode::ReadFixed::new(types::Fd(0), std::ptr::null_mut(), 0, 0).build();
        assert_eq!(opcode_of(&e), opcode::ReadFixed::CODE);
        assert_eq!(opcode_of(&opcode::Nop::new().build()), opcode::Nop::CODE);
    }

    #[test]
    fn external_slots_are_taken_in_runs_and_given_back() {
        let bell = eventfd();
        let mut ring = Ring::new(8, 4, bell).unwrap();
        ring.init_buffer_table(3);
        let mem = vec![0u8; 3 * 4096];
        let iov = |i: usize| libc::iovec { iov_base: mem[i * 4096..].as_ptr() as *mut _, iov_len: 4096 };
        // SAFETY: `mem` outlives the ring's use of it (emptied below, and the ring drops first).
        let a = unsafe { ring.register_external(&[iov(0)]) }.unwrap();
        let b = unsafe { ring.register_external(&[iov(1), iov(2)]) }.unwrap();
        assert_eq!((a, b, ring.external_slots_used()), (2, 3, 3));
        assert!(unsafe { ring.register_external(&[iov(0)]) }.is_err(), "full");
        ring.unregister_external(a, 1);
        assert!(unsafe { ring.register_external(&[iov(0), iov(1)]) }.is_err(), "no run of two");
        assert_eq!(unsafe { ring.register_external(&[iov(2)]) }.unwrap(), 2, "a freed slot is reused");
        drop(ring);
        // SAFETY: closing our own descriptor.
        unsafe { libc::close(bell) };
    }

    #[test]
    fn a_multishot_entry_keeps_its_slot_until_the_completion_without_more() {
        let bell = eventfd();
        let ring = RefCell::new(Ring::new(8, 4, bell).unwrap());
        let fd = eventfd();
        let log = Rc::new(Log::default());
        let e = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32).multi(true).build();
        // SAFETY: a poll names only the descriptor, open for the whole test.
        let id = unsafe { ring.borrow_mut().push_with_id(e, log.clone(), 7) }.unwrap();
        ring.borrow_mut().submit();
        for n in 1..=3 {
            kick(fd);
            turn_until(&ring, || log.0.borrow().len() >= n);
            assert!(log.0.borrow()[n - 1].2, "completion {n} promises more");
            assert_eq!(ring.borrow().in_flight(), 1, "the slot stays taken");
        }
        let ignore = Rc::new(Log::default());
        ring.borrow_mut().cancel_op(id, ignore.clone(), 1).unwrap();
        turn_until(&ring, || log.0.borrow().last().is_some_and(|c| !c.2) && !ignore.0.borrow().is_empty());
        assert_eq!(log.0.borrow().last().unwrap().1, -libc::ECANCELED);
        assert_eq!(ignore.0.borrow()[0].1, 0, "the cancel found it");
        assert_eq!(ring.borrow().in_flight(), 0);
        // SAFETY: closing our own descriptors.
        unsafe { libc::close(fd) };
        unsafe { libc::close(bell) };
    }

    #[test]
    fn a_late_cancel_misses_the_operation_that_reused_the_slot() {
        let bell = eventfd();
        let ring = RefCell::new(Ring::new(8, 1, bell).unwrap());
        let done = Rc::new(Log::default());
        // SAFETY: a no-op names no memory.
        let old = unsafe { ring.borrow_mut().push_with_id(opcode::Nop::new().build(), done.clone(), 0) }.unwrap();
        turn_until(&ring, || !done.0.borrow().is_empty());
        let fd = eventfd();
        let poll = Rc::new(Log::default());
        let e = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32).build();
        // SAFETY: as above.
        let new = unsafe { ring.borrow_mut().push_with_id(e, poll.clone(), 0) }.unwrap();
        assert_eq!(old as u32, new as u32, "the one slot is reused");
        assert_ne!(old, new, "with a new generation");
        let cancel = Rc::new(Log::default());
        ring.borrow_mut().cancel_op(old, cancel.clone(), 0).unwrap();
        turn_until(&ring, || !cancel.0.borrow().is_empty());
        assert_eq!(cancel.0.borrow()[0].1, -libc::ENOENT);
        assert!(poll.0.borrow().is_empty(), "the new operation was not cancelled");
        kick(fd);
        turn_until(&ring, || !poll.0.borrow().is_empty());
        assert!(poll.0.borrow()[0].1 > 0);
        // SAFETY: closing our own descriptors.
        unsafe { libc::close(fd) };
        unsafe { libc::close(bell) };
    }
}
