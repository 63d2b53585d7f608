//! I/O statistics: per-core counters updated on completion, summed across cores on request.

use crate::io::{IoStatus, IoType};

/// Counters of one bdev on one core (only that core writes them). Laid out so that a read or
/// a write updates one cache line (two with the `Rc`'s counts and the histogram's pointer
/// before it): spread as `IoStat` is, a read touched three (see `ChannelInner` for why lines
/// count).
#[derive(Default)]
#[repr(C)]
pub(crate) struct ChannelStats {
    /// The latency histogram while enabled (see `histogram`); None costs one branch per I/O.
    hist: std::cell::UnsafeCell<Option<Box<crate::histogram::CoreHistogram>>>,
    c: std::cell::UnsafeCell<Counters>,
}

/// The counters of one I/O type whose latency is kept, side by side.
#[repr(C)]
struct Timed {
    bytes: u64,
    ops: u64,
    ticks: u64,
    max: u64,
    /// u64::MAX while none.
    min: u64,
}

impl Default for Timed {
    fn default() -> Self {
        Timed { bytes: 0, ops: 0, ticks: 0, max: 0, min: u64::MAX }
    }
}

impl Timed {
    #[inline(always)]
    fn record(&mut self, bytes: u64, ticks: u64) {
        self.bytes += bytes;
        self.ops += 1;
        self.ticks += ticks;
        self.max = self.max.max(ticks);
        self.min = self.min.min(ticks);
    }
}

/// What `ChannelStats` counts, in the order of how often it changes.
#[derive(Default)]
#[repr(C)]
struct Counters {
    read: Timed,
    write: Timed,
    unmap: Timed,
    copy: Timed,
    bytes_write_zeroes: u64,
    num_write_zeroes_ops: u64,
    num_flush_ops: u64,
    num_reset_ops: u64,
    io_errors: u64,
    errors: [u64; ERROR_KINDS.len()],
}

impl Counters {
    /// `ChannelStats::record` of a failed request or of a type other than read and write.
    #[cold]
    #[inline(never)]
    fn record_other(&mut self, t: IoType, bytes: u64, status: IoStatus, ticks: u64) {
        if !matches!(status, IoStatus::Success) {
            self.io_errors += 1;
            self.errors[error_kind(status)] += 1;
            return;
        }
        match t {
            IoType::Read => self.read.record(bytes, ticks),
            IoType::Write => self.write.record(bytes, ticks),
            IoType::Unmap => self.unmap.record(bytes, ticks),
            IoType::Copy => self.copy.record(bytes, ticks),
            IoType::WriteZeroes => {
                self.bytes_write_zeroes += bytes;
                self.num_write_zeroes_ops += 1;
            }
            IoType::Flush => self.num_flush_ops += 1,
            IoType::Reset => self.num_reset_ops += 1,
            _ => {}
        }
    }

    fn stat(&self) -> IoStat {
        IoStat {
            bytes_read: self.read.bytes,
            num_read_ops: self.read.ops,
            bytes_written: self.write.bytes,
            num_write_ops: self.write.ops,
            bytes_unmapped: self.unmap.bytes,
            num_unmap_ops: self.unmap.ops,
            bytes_write_zeroes: self.bytes_write_zeroes,
            num_write_zeroes_ops: self.num_write_zeroes_ops,
            num_flush_ops: self.num_flush_ops,
            num_reset_ops: self.num_reset_ops,
            read_latency_ticks: self.read.ticks,
            write_latency_ticks: self.write.ticks,
            unmap_latency_ticks: self.unmap.ticks,
            max_read_latency_ticks: self.read.max,
            max_write_latency_ticks: self.write.max,
            io_errors: self.io_errors,
            bytes_copied: self.copy.bytes,
            num_copy_ops: self.copy.ops,
            copy_latency_ticks: self.copy.ticks,
            min_latency_ticks: [self.read.min, self.write.min, self.unmap.min, self.copy.min],
            max_unmap_latency_ticks: self.unmap.max,
            max_copy_latency_ticks: self.copy.max,
            errors: self.errors,
        }
    }

    /// Clears what `mode` names, as SPDK's `spdk_bdev_reset_io_stat` (`All` also clears the
    /// counters SPDK's statistics lack: write-zeroes, flush and reset counts).
    fn reset(&mut self, mode: ResetMode) {
        match mode {
            ResetMode::None => {}
            ResetMode::Error => {
                self.io_errors = 0;
                self.errors = [0; ERROR_KINDS.len()];
            }
            ResetMode::MaxMin => {
                for t in [&mut self.read, &mut self.write, &mut self.unmap, &mut self.copy] {
                    t.max = 0;
                    t.min = u64::MAX;
                }
            }
            ResetMode::All => *self = Counters::default(),
        }
    }
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
        IoStatus::Miscompare { .. } => 2,
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
        let c = unsafe { &mut *self.c.get() };
        // SAFETY: as above.
        if let Some(h) = unsafe { &mut *self.hist.get() } {
            h.record(t, ticks);
        }
        // Reads and writes that succeeded first, without a jump table: this runs once per
        // request and layer.
        match (t, status) {
            (IoType::Read, IoStatus::Success) => c.read.record(bytes, ticks),
            (IoType::Write, IoStatus::Success) => c.write.record(bytes, ticks),
            _ => c.record_other(t, bytes, status, ticks),
        }
    }

    pub(crate) fn snapshot(&self) -> IoStat {
        // SAFETY: as in `record`: single-threaded, no outstanding reference.
        unsafe { &*self.c.get() }.stat()
    }

    /// Resets the counters as `mode` says (on the owning core).
    pub(crate) fn reset(&self, mode: ResetMode) {
        // SAFETY: as in `record`.
        unsafe { &mut *self.c.get() }.reset(mode);
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Each type's counters land in the snapshot's fields of that type, and each reset mode
    /// clears what it names and nothing else.
    #[test]
    fn counters_map_to_the_snapshot_and_reset_by_mode() {
        let c = ChannelStats::default();
        c.record(IoType::Read, 4096, IoStatus::Success, 10);
        c.record(IoType::Read, 8192, IoStatus::Success, 30);
        c.record(IoType::Write, 512, IoStatus::Success, 7);
        c.record(IoType::Unmap, 1 << 20, IoStatus::Success, 5);
        c.record(IoType::Copy, 4096, IoStatus::Success, 9);
        c.record(IoType::WriteZeroes, 2048, IoStatus::Success, 1);
        c.record(IoType::Flush, 0, IoStatus::Success, 1);
        c.record(IoType::Reset, 0, IoStatus::Success, 1);
        c.record(IoType::Read, 4096, IoStatus::Aborted, 3);
        let s = c.snapshot();
        assert_eq!((s.bytes_read, s.num_read_ops, s.read_latency_ticks), (12288, 2, 40));
        assert_eq!((s.max_read_latency_ticks, s.min_latency_ticks[0]), (30, 10));
        assert_eq!(
            (s.bytes_written, s.num_write_ops, s.write_latency_ticks, s.max_write_latency_ticks),
            (512, 1, 7, 7)
        );
        assert_eq!(
            (s.bytes_unmapped, s.num_unmap_ops, s.unmap_latency_ticks, s.max_unmap_latency_ticks),
            (1 << 20, 1, 5, 5)
        );
        assert_eq!((s.bytes_copied, s.num_copy_ops, s.copy_latency_ticks, s.max_copy_latency_ticks), (4096, 1, 9, 9));
        assert_eq!(s.min_latency_ticks, [10, 7, 5, 9]);
        assert_eq!((s.bytes_write_zeroes, s.num_write_zeroes_ops, s.num_flush_ops, s.num_reset_ops), (2048, 1, 1, 1));
        assert_eq!((s.io_errors, s.errors[1]), (1, 1));

        c.reset(ResetMode::MaxMin);
        let m = c.snapshot();
        assert_eq!((m.max_read_latency_ticks, m.max_write_latency_ticks, m.max_unmap_latency_ticks), (0, 0, 0));
        assert_eq!((m.max_copy_latency_ticks, m.min_latency_ticks), (0, [u64::MAX; 4]));
        assert_eq!((m.num_read_ops, m.read_latency_ticks, m.io_errors), (2, 40, 1));

        c.reset(ResetMode::Error);
        let e = c.snapshot();
        assert_eq!((e.io_errors, e.errors), (0, [0; ERROR_KINDS.len()]));
        assert_eq!(e.num_write_ops, 1);

        c.reset(ResetMode::All);
        assert_eq!(c.snapshot(), IoStat::default());
    }
}
