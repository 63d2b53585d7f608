//! A job: one bdev driven at a fixed queue depth from one reactor until its time is up.
//!
//! Each queue slot owns one buffer for the whole run, and a completion resubmits from its own
//! slot, so the steady state allocates nothing, takes no lock and makes no syscall of its own.

use crate::hist::Histogram;
use crate::report::JobResult;
use crate::workload::{JobSpec, Workload};
use ferrite_bdev::{Bdev, BdevDesc, Completed, IoBufs, IoChannel, IoCompleter, IoRequest, IoStatus, IoType};
use ferrite_reactor::{oneshot, tsc, IoBuf};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// Counters a job publishes for the once-a-second progress line (plain stores by the owner).
#[derive(Default)]
pub struct Progress {
    /// I/Os completed so far.
    pub ios: AtomicU64,
    /// Bytes moved so far.
    pub bytes: AtomicU64,
    /// Latency of the I/Os counted in `ios`, summed, in nanoseconds.
    pub latency_ns: AtomicU64,
}

/// Where a job runs and what part of its bdev it may touch.
#[derive(Debug, Clone)]
pub struct JobPlacement {
    /// Bdev name.
    pub bdev: String,
    /// CPU of the job's reactor (for the report).
    pub core: usize,
    /// This job's share of the bdev when several jobs share it: `index` of `of`.
    pub index: u32,
    /// Number of jobs on this bdev.
    pub of: u32,
}

/// Why a job could not start.
pub type JobError = String;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Write,
    Read,
}

struct Slot {
    /// For verify: the pattern seed the last write used, and where.
    seed: u64,
    offset: u64,
    /// For verify: the kind of the slot's I/O in flight (a slot starts as if a read finished,
    /// so its first I/O is a write).
    phase: Phase,
    /// For compare_and_write: the slot's compare buffer, while no request carries it.
    cmp: Option<Box<IoBufs>>,
}

struct Job {
    spec: JobSpec,
    place: JobPlacement,
    ch: IoChannel,
    desc: Option<BdevDesc>,
    me: Option<Rc<dyn IoCompleter>>,
    io_blocks: u64,
    start_block: u64,
    span_ios: u64,
    cursor: u64,
    rng: u64,
    null_bdev: bool,
    slots: Vec<Slot>,
    /// For compare_and_write: the versions of the units.
    caw: Option<crate::caw::Units>,
    /// For verify and reset: the I/O units a slot is writing or reading back, which no other
    /// slot may take meanwhile (as bdevperf's `outstanding` array): a slot held up (a path
    /// failing over) while the cursor wraps would otherwise have another write its units, and
    /// a read-back see the other's pattern.
    in_use: Vec<u64>,
    in_flight: u32,
    stopping: bool,
    removed: Arc<AtomicBool>,
    start_tick: u64,
    ns_per_tick_q32: u128,
    hist: Histogram,
    ios: u64,
    bytes: u64,
    /// Sum of the counted I/Os' latencies, in nanoseconds (published in `progress`).
    latency_ns: u64,
    failed: u64,
    verify_errors: u64,
    first_error: Option<String>,
    progress: Arc<Progress>,
    done: Option<oneshot::Sender<Result<JobResult, JobError>>>,
}

struct JobCell(RefCell<Job>);

#[inline]
fn xorshift(s: &mut u64) -> u64 {
    let mut x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *s = x;
    x
}

pub(crate) fn fill_pattern(buf: &mut [u8], seed: u64) {
    for (i, w) in buf.chunks_exact_mut(8).enumerate() {
        w.copy_from_slice(&(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ i as u64).to_le_bytes());
    }
}

fn check_pattern(buf: &[u8], seed: u64, zeroes: bool) -> bool {
    if zeroes {
        return buf.iter().all(|&b| b == 0);
    }
    buf.chunks_exact(8)
        .enumerate()
        .all(|(i, w)| w == (seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ i as u64).to_le_bytes())
}

impl Job {
    fn next_offset(&mut self) -> u64 {
        let n = loop {
            let n = if self.spec.workload.random() {
                ((xorshift(&mut self.rng) as u128 * self.span_ios as u128) >> 64) as u64
            } else {
                let n = self.cursor;
                self.cursor = (self.cursor + 1) % self.span_ios;
                n
            };
            if !self.spec.workload.owns_units() {
                break n;
            }
            // At most queue-depth units are in use (a short list) and the span holds more than
            // that (checked at start): the search ends.
            if self.in_use.contains(&n) {
                continue;
            }
            self.in_use.push(n);
            break n;
        };
        self.start_block + n * self.io_blocks
    }

    /// The verify pair of `slot` is over: its unit is free for the others.
    fn release_unit(&mut self, slot: usize) {
        let n = (self.slots[slot].offset - self.start_block) / self.io_blocks;
        if let Some(i) = self.in_use.iter().position(|&u| u == n) {
            self.in_use.swap_remove(i);
        }
    }

    /// Turns `req` (which holds the slot's buffer, if any) into the next request for `slot`,
    /// in place: a completed request is resubmitted as it is, without being moved or rebuilt.
    fn prepare(&mut self, slot: usize, req: &mut IoRequest) {
        let w = self.spec.workload;
        req.num_blocks = self.io_blocks;
        if w.verifies() && self.slots[slot].phase == Phase::Write {
            // The write just completed: read the same blocks back.
            self.slots[slot].phase = Phase::Read;
            req.io_type = IoType::Read;
            req.offset_blocks = self.slots[slot].offset;
            return;
        }
        let off = self.next_offset();
        req.offset_blocks = off;
        if self.caw.is_some() {
            return self.prepare_caw(slot, off, req);
        }
        req.io_type = match w {
            Workload::Unmap => IoType::Unmap,
            Workload::Flush => IoType::Flush,
            Workload::Verify | Workload::Reset => {
                let seed = xorshift(&mut self.rng);
                fill_pattern(&mut req.bufs[0], seed);
                let s = &mut self.slots[slot];
                (s.seed, s.offset, s.phase) = (seed, off, Phase::Write);
                IoType::Write
            }
            Workload::Read | Workload::RandRead => IoType::Read,
            Workload::Write | Workload::RandWrite | Workload::CompareAndWrite => IoType::Write,
            _ if (xorshift(&mut self.rng) % 100) < self.spec.rw_mix_read as u64 => IoType::Read,
            _ => IoType::Write,
        };
    }

    /// `prepare` for a compare-and-write job (out of line: the other workloads' requests do not
    /// carry its code).
    #[inline(never)]
    fn prepare_caw(&mut self, slot: usize, off: u64, req: &mut IoRequest) {
        let units = self.caw.as_ref().expect("a compare-and-write job");
        let unit = (off - self.start_block) / self.io_blocks;
        self.slots[slot].offset = off;
        units.prepare(unit, req, &mut self.slots[slot].cmp)
    }

    /// Starts the first request of `slot`.
    fn submit(&mut self, slot: usize, buf: Option<IoBuf>) {
        let mut req = IoRequest::new(IoType::Read, 0, 0);
        req.bufs.extend(buf);
        self.prepare(slot, &mut req);
        self.in_flight += 1;
        let me = self.me.clone().expect("job running");
        self.ch.submit(req, me, slot as u64);
    }

    fn finish(&mut self) {
        let runtime = tsc::ticks_to_nanos(tsc::ticks() - self.start_tick) as f64 / 1e9;
        self.me = None;
        self.desc = None;
        self.progress.ios.store(self.ios, Ordering::Relaxed);
        let result = JobResult {
            bdev: self.place.bdev.clone(),
            core: self.place.core,
            workload: self.spec.workload.name().to_string(),
            queue_depth: self.spec.queue_depth,
            io_size: self.spec.io_size,
            runtime_secs: runtime,
            ios: self.ios,
            bytes: self.bytes,
            failed: self.failed,
            verify_errors: self.verify_errors,
            latency: std::mem::take(&mut self.hist),
        };
        if let Some(tx) = self.done.take() {
            let res = match (&self.first_error, self.removed.load(Ordering::Relaxed)) {
                (_, true) => Err(format!("bdev {} was deleted during the run", self.place.bdev)),
                _ => Ok(result),
            };
            tx.send(res);
        }
    }
}

impl IoCompleter for JobCell {
    fn io_done(&self, tag: u64, io: Completed) {
        let mut job = self.0.borrow_mut();
        let job = &mut *job;
        job.in_flight -= 1;
        let slot = tag as usize;
        let mut io = io;
        let (status, latency_ticks, io_type) = (io.status, io.latency_ticks, io.req.io_type);
        let caw = job.caw.as_mut().map(|units| {
            let s = &mut job.slots[slot];
            let unit = (s.offset - job.start_block) / job.io_blocks;
            units.completed(unit, &mut io.req, status, &mut s.cmp)
        });
        if caw.is_some() {
            job.release_unit(slot);
        }
        if caw == Some(crate::caw::Outcome::Miscompare) {
            job.verify_errors += 1;
            if job.first_error.is_none() {
                job.first_error = Some(format!("data mismatch at block {}", job.slots[slot].offset));
            }
        } else if status == IoStatus::Success {
            let verify_read = job.spec.workload.verifies() && io_type == IoType::Read;
            if verify_read {
                job.release_unit(slot);
                let s = &job.slots[slot];
                let ok = io.req.bufs.first().is_some_and(|b| check_pattern(b, s.seed, job.null_bdev));
                if !ok {
                    job.verify_errors += 1;
                    if job.first_error.is_none() {
                        job.first_error = Some(format!("data mismatch at block {}", s.offset));
                    }
                }
            }
            // A verify pair (write + read) counts as one I/O, as in bdevperf; a unit's first
            // write before its compare-and-writes does not count.
            let counts = match caw {
                Some(o) => o == crate::caw::Outcome::Done,
                None => !job.spec.workload.verifies() || verify_read,
            };
            if counts {
                job.ios += 1;
                job.bytes += job.spec.io_size as u64;
                let ns = ((latency_ticks as u128 * job.ns_per_tick_q32) >> 32) as u64;
                job.hist.record(ns);
                job.latency_ns = job.latency_ns.wrapping_add(ns);
                job.progress.latency_ns.store(job.latency_ns, Ordering::Relaxed);
                job.progress.ios.store(job.ios, Ordering::Relaxed);
                job.progress.bytes.store(job.bytes, Ordering::Relaxed);
            }
        } else {
            job.failed += 1;
            if job.first_error.is_none() {
                job.first_error = Some(format!("{io_type:?} failed: {status}"));
            }
            if job.spec.workload.verifies() {
                job.release_unit(slot);
                job.slots[slot].phase = Phase::Read; // start over with a fresh write
            }
            if matches!(status, IoStatus::Removed) {
                job.stopping = true;
            }
        }
        if job.removed.load(Ordering::Relaxed) || job.spec.abort.load(Ordering::Relaxed) {
            job.stopping = true;
        }
        if job.stopping {
            drop(io);
            if job.in_flight == 0 {
                job.finish();
            }
            return;
        }
        // The same request, turned into the slot's next one in place.
        job.prepare(slot, &mut io.req);
        job.in_flight += 1;
        let me = job.me.clone().expect("job running");
        job.ch.resubmit(io, me, slot as u64);
    }
}

/// Starts a job on the calling reactor; the receiver yields its result when its time is up
/// (or an error if its bdev goes away).
pub fn start(
    spec: JobSpec,
    place: JobPlacement,
    progress: Arc<Progress>,
) -> oneshot::Receiver<Result<JobResult, JobError>> {
    let (tx, rx) = oneshot::channel();
    if let Err(e) = try_start(spec, place, progress, tx) {
        let (tx, rx) = oneshot::channel();
        tx.send(Err(e));
        return rx;
    }
    rx
}

fn try_start(
    spec: JobSpec,
    place: JobPlacement,
    progress: Arc<Progress>,
    tx: oneshot::Sender<Result<JobResult, JobError>>,
) -> Result<(), JobError> {
    let removed = Arc::new(AtomicBool::new(false));
    let r2 = removed.clone();
    let desc = Bdev::open(&place.bdev, spec.workload.writes(), move || r2.store(true, Ordering::Relaxed))
        .map_err(|e| e.to_string())?;
    let bdev = desc.bdev().clone();
    let bs = bdev.block_size() as u64;
    if spec.io_size == 0 || !(spec.io_size as u64).is_multiple_of(bs) {
        return Err(format!("I/O size {} is not a multiple of {}'s block size {bs}", spec.io_size, bdev.name()));
    }
    let io_blocks = spec.io_size as u64 / bs;
    let share = bdev.num_blocks() / place.of as u64;
    let span_ios = share / io_blocks;
    if span_ios == 0 {
        return Err(format!("bdev {} is too small for {}-byte I/O", bdev.name(), spec.io_size));
    }
    let span_ios = match spec.workload {
        Workload::CompareAndWrite => span_ios.min(crate::caw::MAX_UNITS),
        _ => span_ios,
    };
    if spec.workload.owns_units() && span_ios <= spec.queue_depth as u64 {
        return Err(format!("bdev {} is too small for verify at queue depth {}", bdev.name(), spec.queue_depth));
    }
    let ch = desc.channel().map_err(|e| e.to_string())?;
    let qd = spec.queue_depth as usize;
    let duration = spec.duration;
    let job = Rc::new(JobCell(RefCell::new(Job {
        null_bdev: bdev.module() == "null",
        io_blocks,
        start_block: share * place.index as u64,
        span_ios,
        cursor: 0,
        rng: 0x2545_f491_4f6c_dd1d ^ ((place.core as u64 + 1) << 32) ^ place.index as u64,
        slots: (0..qd).map(|_| Slot { seed: 0, offset: 0, phase: Phase::Read, cmp: None }).collect(),
        caw: (spec.workload == Workload::CompareAndWrite).then(|| crate::caw::Units::new(span_ios)),
        in_use: Vec::with_capacity(qd),
        in_flight: 0,
        stopping: false,
        removed,
        start_tick: tsc::ticks(),
        ns_per_tick_q32: (1_000_000_000u128 << 32) / tsc::ticks_per_sec() as u128,
        hist: Histogram::new(),
        ios: 0,
        bytes: 0,
        latency_ns: 0,
        failed: 0,
        verify_errors: 0,
        first_error: None,
        progress,
        done: Some(tx),
        me: None,
        desc: Some(desc),
        ch,
        spec,
        place,
    })));
    let me: Rc<dyn IoCompleter> = job.clone();
    {
        let mut j = job.0.borrow_mut();
        j.me = Some(me);
        let with_payload = !matches!(j.spec.workload, Workload::Unmap | Workload::Flush);
        for slot in 0..qd {
            // A write's payload is a pattern, never what the pool buffer held before (another
            // bdev's data that a read, examine's included, left in it).
            let buf = with_payload.then(|| {
                let mut b = ferrite_reactor::alloc_buf(j.spec.io_size as usize);
                // Compare-and-write slots hold the same bytes (see `caw`).
                let seed = if j.caw.is_some() { 0x5eed } else { 0x5eed ^ slot as u64 };
                fill_pattern(&mut b, seed);
                b
            });
            if let Some(b) = buf.as_ref().filter(|_| j.caw.is_some()) {
                j.slots[slot].cmp = Some(crate::caw::compare_buffer(b));
            }
            j.submit(slot, buf);
        }
    }
    if job.0.borrow().spec.workload == Workload::Reset {
        resets(job.clone());
    }
    let j2 = job.clone();
    ferrite_reactor::after(duration, move || {
        let mut j = j2.0.borrow_mut();
        j.stopping = true;
        if j.in_flight == 0 {
            j.finish();
            return;
        }
        drop(j);
        // Weak: a job that finishes meanwhile lets go of its channel (and what the bdev holds
        // through it) now, not when this timer fires; a shutdown waits for that.
        let weak = Rc::downgrade(&j2);
        drop(j2);
        ferrite_reactor::after(DRAIN_GRACE, move || {
            if let Some(job) = weak.upgrade() {
                abort_outstanding(&job);
            }
        });
    });
    Ok(())
}

/// How long a job waits after its time is up for its outstanding I/O to complete before it
/// aborts it. bdevperf waits for as long as the bdev module takes; Ferrite's run ends on time
/// whatever a device or controller does (a controller reset that never succeeds, a command
/// never answered).
pub const DRAIN_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// The job's time is up and I/O is still outstanding [`DRAIN_GRACE`] later: an abort request
/// for each queue slot (the bdev layer completes, as Aborted, what waits in it or in a module
/// that can stop it, such as the NVMe host's requests waiting for a controller to come back;
/// a slot with nothing outstanding is not found). The job then finishes as its I/O completes.
fn abort_outstanding(job: &Rc<JobCell>) {
    let (ch, qd) = {
        let j = job.0.borrow();
        if j.in_flight == 0 || j.done.is_none() {
            return;
        }
        log::warn!(
            "job {} on core {}: {} I/O still outstanding {} s after the run's end; aborting them",
            j.place.bdev,
            j.place.core,
            j.in_flight,
            DRAIN_GRACE.as_secs()
        );
        (j.ch.clone(), j.spec.queue_depth)
    };
    let me: Rc<dyn IoCompleter> = job.clone();
    for slot in 0..u64::from(qd) {
        let req = IoRequest::abort(&me, slot);
        let ch = ch.clone();
        ferrite_reactor::spawn_local(async move {
            let _ = ch.submit_wait(req).await;
        })
        .detach();
    }
}

/// How often a `reset` job resets its bdev (bdevperf's period).
const RESET_PERIOD: std::time::Duration = std::time::Duration::from_secs(10);

/// A `reset` job's resets: one every [`RESET_PERIOD`] until the job stops, each counted as a
/// failed I/O (with the first error noted) if it fails.
fn resets(job: Rc<JobCell>) {
    ferrite_reactor::spawn_local(async move {
        loop {
            ferrite_reactor::sleep(RESET_PERIOD).await;
            let ch = {
                let j = job.0.borrow();
                if j.stopping {
                    return;
                }
                j.ch.clone()
            };
            let c = ch.submit_wait(IoRequest::new(IoType::Reset, 0, 0)).await;
            let mut j = job.0.borrow_mut();
            if c.status != IoStatus::Success {
                j.failed += 1;
                if j.first_error.is_none() {
                    j.first_error = Some(format!("reset failed: {}", c.status));
                }
            }
        }
    })
    .detach();
}
