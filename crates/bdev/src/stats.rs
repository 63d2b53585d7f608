//! I/O statistics: per-core counters updated on completion, summed across cores on request.

use crate::io::{IoStatus, IoType};

/// Counters of one bdev on one core (only that core writes them).
#[derive(Default)]
pub(crate) struct ChannelStats {
    s: std::cell::UnsafeCell<IoStat>,
}

/// A snapshot of a bdev's I/O counters, in SPDK's `bdev_get_iostat` terms.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
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
}

impl ChannelStats {
    #[inline]
    pub(crate) fn record(&self, t: IoType, bytes: u64, status: IoStatus, ticks: u64) {
        // SAFETY: ChannelStats is !Sync (UnsafeCell) and lives in an Rc on one thread; no
        // reference into it outlives this call or `snapshot`, so this is the only access.
        let s = unsafe { &mut *self.s.get() };
        if status != IoStatus::Success {
            s.io_errors += 1;
        } else {
            match t {
                IoType::Read => {
                    s.bytes_read += bytes;
                    s.num_read_ops += 1;
                    s.read_latency_ticks += ticks;
                    s.max_read_latency_ticks = s.max_read_latency_ticks.max(ticks);
                }
                IoType::Write => {
                    s.bytes_written += bytes;
                    s.num_write_ops += 1;
                    s.write_latency_ticks += ticks;
                    s.max_write_latency_ticks = s.max_write_latency_ticks.max(ticks);
                }
                IoType::Unmap => {
                    s.bytes_unmapped += bytes;
                    s.num_unmap_ops += 1;
                    s.unmap_latency_ticks += ticks;
                }
                IoType::WriteZeroes => {
                    s.bytes_write_zeroes += bytes;
                    s.num_write_zeroes_ops += 1;
                }
                IoType::Flush => s.num_flush_ops += 1,
                IoType::Reset => s.num_reset_ops += 1,
            }
        }
    }

    pub(crate) fn snapshot(&self) -> IoStat {
        // SAFETY: as in `record`: single-threaded, no outstanding reference.
        unsafe { *self.s.get() }
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
    }
}
