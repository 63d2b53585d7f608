//! I/O statistics: per-core counters updated on completion, summed across cores on request.

use crate::io::{IoStatus, IoType};

/// Counters of one bdev on one core (only that core writes them).
#[derive(Default)]
pub(crate) struct ChannelStats {
    s: std::cell::UnsafeCell<IoStat>,
    /// The latency histogram while enabled (see `histogram`); None costs one branch per I/O.
    hist: std::cell::UnsafeCell<Option<Box<crate::histogram::CoreHistogram>>>,
}

/// A snapshot of a bdev's I/O counters, in SPDK's `bdev_get_iostat` terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IoStat {
    /// Bytes read.
    pub bytes_read: u64,
    /// Successful reads.
    pub num_read_ops: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// Successful writes.
    pub num_write_ops: u64,
    /// Bytes unmapped.
    pub bytes_unmapped: u64,
    /// Successful unmaps.
    pub num_unmap_ops: u64,
    /// Bytes zeroed by write-zeroes.
    pub bytes_write_zeroes: u64,
    /// Successful write-zeroes.
    pub num_write_zeroes_ops: u64,
    /// Successful flushes.
    pub num_flush_ops: u64,
    /// Resets.
    pub num_reset_ops: u64,
    /// Total ticks of successful reads.
    pub read_latency_ticks: u64,
    /// Total ticks of successful writes.
    pub write_latency_ticks: u64,
    /// Total ticks of successful unmaps.
    pub unmap_latency_ticks: u64,
    /// Longest read, in ticks.
    pub max_read_latency_ticks: u64,
    /// Longest write, in ticks.
    pub max_write_latency_ticks: u64,
    /// Failed I/Os of any type.
    pub io_errors: u64,
    /// Bytes copied by copy requests.
    pub bytes_copied: u64,
    /// Successful copies.
    pub num_copy_ops: u64,
    /// Total ticks of successful copies.
    pub copy_latency_ticks: u64,
    /// Shortest read, write, unmap and copy, in ticks (u64::MAX while none).
    pub min_latency_ticks: [u64; 4],
    /// Longest unmap and copy, in ticks.
    pub max_unmap_latency_ticks: u64,
    /// Longest copy, in ticks.
    pub max_copy_latency_ticks: u64,
    /// Failed I/Os by SPDK status name (see `ERROR_KINDS`).
    pub errors: [u64; ERROR_KINDS.len()],
}

/// SPDK's names of the failure statuses counted in `IoStat::errors` (keys of `io_error`).
pub const ERROR_KINDS: [&str; 6] = ["failed", "aborted", "miscompare", "timeout", "nvme_error", "scsi_error"];

fn error_kind(s: IoStatus) -> usize {
    match s {
        IoStatus::Aborted => 1,
        IoStatus::Miscompare => 2,
        IoStatus::TimedOut => 3,
        IoStatus::Nvme { .. } => 4,
        IoStatus::Scsi { .. } => 5,
        _ => 0,
    }
}

impl Default for IoStat {
    fn default() -> Self {
        Self {
            bytes_read: 0,
            num_read_ops: 0,
            bytes_written: 0,
            num_write_ops: 0,
            bytes_unmapped: 0,
            num_unmap_ops: 0,
            bytes_write_zeroes: 0,
            num_write_zeroes_ops: 0,
            num_flush_ops: 0,
            num_reset_ops: 0,
            read_latency_ticks: 0,
            write_latency_ticks: 0,
            unmap_latency_ticks: 0,
            max_read_latency_ticks: 0,
            max_write_latency_ticks: 0,
            io_errors: 0,
            bytes_copied: 0,
            num_copy_ops: 0,
            copy_latency_ticks: 0,
            min_latency_ticks: [u64::MAX; 4],
            max_unmap_latency_ticks: 0,
            max_copy_latency_ticks: 0,
            errors: [0; ERROR_KINDS.len()],
        }
    }
}

impl ChannelStats {
    #[inline]
    pub(crate) fn record(&self, t: IoType, bytes: u64, status: IoStatus, ticks: u64) {
        // SAFETY: ChannelStats is !Sync (UnsafeCell) and lives in an Rc on one thread; no
        // reference into it outlives this call or `snapshot`, so this is the only access.
        let s = unsafe { &mut *self.s.get() };
        // SAFETY: as above.
        if let Some(h) = unsafe { &mut *self.hist.get() } {
            h.record(t, ticks);
        }
        if status != IoStatus::Success {
            s.io_errors += 1;
            s.errors[error_kind(status)] += 1;
        } else {
            match t {
                IoType::Read => {
                    s.bytes_read += bytes;
                    s.num_read_ops += 1;
                    s.read_latency_ticks += ticks;
                    s.max_read_latency_ticks = s.max_read_latency_ticks.max(ticks);
                    s.min_latency_ticks[0] = s.min_latency_ticks[0].min(ticks);
                }
                IoType::Write => {
                    s.bytes_written += bytes;
                    s.num_write_ops += 1;
                    s.write_latency_ticks += ticks;
                    s.max_write_latency_ticks = s.max_write_latency_ticks.max(ticks);
                    s.min_latency_ticks[1] = s.min_latency_ticks[1].min(ticks);
                }
                IoType::Unmap => {
                    s.bytes_unmapped += bytes;
                    s.num_unmap_ops += 1;
                    s.unmap_latency_ticks += ticks;
                    s.max_unmap_latency_ticks = s.max_unmap_latency_ticks.max(ticks);
                    s.min_latency_ticks[2] = s.min_latency_ticks[2].min(ticks);
                }
                IoType::WriteZeroes => {
                    s.bytes_write_zeroes += bytes;
                    s.num_write_zeroes_ops += 1;
                }
                IoType::Flush => s.num_flush_ops += 1,
                IoType::Reset => s.num_reset_ops += 1,
                IoType::Copy => {
                    s.bytes_copied += bytes;
                    s.num_copy_ops += 1;
                    s.copy_latency_ticks += ticks;
                    s.max_copy_latency_ticks = s.max_copy_latency_ticks.max(ticks);
                    s.min_latency_ticks[3] = s.min_latency_ticks[3].min(ticks);
                }
                _ => {}
            }
        }
    }

    pub(crate) fn snapshot(&self) -> IoStat {
        // SAFETY: as in `record`: single-threaded, no outstanding reference.
        unsafe { *self.s.get() }
    }

    /// Resets the counters as `mode` says (on the owning core).
    pub(crate) fn reset(&self, mode: ResetMode) {
        // SAFETY: as in `record`.
        unsafe { &mut *self.s.get() }.reset(mode);
    }

    /// Starts (from zero) or stops this core's histogram; an unchanged setting keeps its counts.
    pub(crate) fn set_histogram(&self, cfg: Option<crate::histogram::HistConfig>) {
        // SAFETY: as in `record`.
        let h = unsafe { &mut *self.hist.get() };
        match cfg {
            None => *h = None,
            Some(c) => {
                let fresh = c.empty();
                let same = h.as_ref().is_some_and(|x| x.opc == c.opc && x.h.same_shape(&fresh));
                if !same {
                    *h = Some(Box::new(crate::histogram::CoreHistogram { opc: c.opc, h: fresh }));
                }
            }
        }
    }

    /// A copy of this core's histogram, if enabled.
    pub(crate) fn histogram(&self) -> Option<crate::histogram::Histogram> {
        // SAFETY: as in `record`.
        unsafe { &*self.hist.get() }.as_ref().map(|h| h.h.clone())
    }
}

/// What `bdev_reset_iostat` (and `bdev_get_iostat`'s `reset_mode`) clears, with SPDK's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetMode {
    /// Every counter.
    All,
    /// Only the largest and smallest latencies.
    MaxMin,
    /// Only the error counters.
    Error,
    /// Nothing.
    None,
}

impl ResetMode {
    /// The mode SPDK calls `name` ("all", "maxmin", "error", "none").
    pub fn from_name(name: &str) -> Option<ResetMode> {
        match name {
            "all" => Some(ResetMode::All),
            "maxmin" => Some(ResetMode::MaxMin),
            "error" => Some(ResetMode::Error),
            "none" => Some(ResetMode::None),
            _ => None,
        }
    }
}

impl IoStat {
    /// Clears what `mode` names, as SPDK's `spdk_bdev_reset_io_stat` (`All` also clears the
    /// counters SPDK's statistics lack: write-zeroes, flush and reset counts).
    pub fn reset(&mut self, mode: ResetMode) {
        match mode {
            ResetMode::None => {}
            ResetMode::Error => {
                self.io_errors = 0;
                self.errors = [0; ERROR_KINDS.len()];
            }
            ResetMode::MaxMin => {
                self.max_read_latency_ticks = 0;
                self.max_write_latency_ticks = 0;
                self.max_unmap_latency_ticks = 0;
                self.max_copy_latency_ticks = 0;
                self.min_latency_ticks = [u64::MAX; 4];
            }
            ResetMode::All => *self = IoStat::default(),
        }
    }

    /// Adds another core's counters.
    pub fn add(&mut self, o: &IoStat) {
        self.bytes_read += o.bytes_read;
        self.num_read_ops += o.num_read_ops;
        self.bytes_written += o.bytes_written;
        self.num_write_ops += o.num_write_ops;
        self.bytes_unmapped += o.bytes_unmapped;
        self.num_unmap_ops += o.num_unmap_ops;
        self.bytes_write_zeroes += o.bytes_write_zeroes;
        self.num_write_zeroes_ops += o.num_write_zeroes_ops;
        self.num_flush_ops += o.num_flush_ops;
        self.num_reset_ops += o.num_reset_ops;
        self.read_latency_ticks += o.read_latency_ticks;
        self.write_latency_ticks += o.write_latency_ticks;
        self.unmap_latency_ticks += o.unmap_latency_ticks;
        self.max_read_latency_ticks = self.max_read_latency_ticks.max(o.max_read_latency_ticks);
        self.max_write_latency_ticks = self.max_write_latency_ticks.max(o.max_write_latency_ticks);
        self.io_errors += o.io_errors;
        self.bytes_copied += o.bytes_copied;
        self.num_copy_ops += o.num_copy_ops;
        self.copy_latency_ticks += o.copy_latency_ticks;
        self.max_unmap_latency_ticks = self.max_unmap_latency_ticks.max(o.max_unmap_latency_ticks);
        self.max_copy_latency_ticks = self.max_copy_latency_ticks.max(o.max_copy_latency_ticks);
        for i in 0..4 {
            self.min_latency_ticks[i] = self.min_latency_ticks[i].min(o.min_latency_ticks[i]);
        }
        for (e, x) in self.errors.iter_mut().zip(o.errors.iter()) {
            *e += x;
        }
    }
}
