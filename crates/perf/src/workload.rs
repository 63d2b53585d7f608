//! Workload names and options, as bdevperf spells them.

/// The I/O pattern of a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// Sequential reads.
    Read,
    /// Sequential writes.
    Write,
    /// Random reads.
    RandRead,
    /// Random writes.
    RandWrite,
    /// Sequential mix of reads and writes (read share from `-M`).
    Rw,
    /// Random mix of reads and writes.
    RandRw,
    /// Each I/O writes a pattern, reads it back and compares.
    Verify,
    /// Verify, with a reset of the bdev every 10 seconds (bdevperf's `reset`).
    Reset,
    /// Unmaps.
    Unmap,
    /// Flushes.
    Flush,
}

impl std::str::FromStr for Workload {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "read" => Self::Read,
            "write" => Self::Write,
            "randread" => Self::RandRead,
            "randwrite" => Self::RandWrite,
            "rw" => Self::Rw,
            "randrw" => Self::RandRw,
            "verify" => Self::Verify,
            "reset" => Self::Reset,
            "unmap" => Self::Unmap,
            "flush" => Self::Flush,
            _ => {
                return Err(format!(
                    "unknown workload {s:?} (read, write, randread, randwrite, rw, randrw, verify, reset, unmap, flush)"
                ))
            }
        })
    }
}

impl Workload {
    /// bdevperf's name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::RandRead => "randread",
            Self::RandWrite => "randwrite",
            Self::Rw => "rw",
            Self::RandRw => "randrw",
            Self::Verify => "verify",
            Self::Reset => "reset",
            Self::Unmap => "unmap",
            Self::Flush => "flush",
        }
    }

    /// True if offsets are random.
    pub fn random(self) -> bool {
        matches!(self, Self::RandRead | Self::RandWrite | Self::RandRw)
    }

    /// True if each I/O is a write read back and compared (verify, reset).
    pub fn verifies(self) -> bool {
        matches!(self, Self::Verify | Self::Reset)
    }

    /// True if the job needs write access.
    pub fn writes(self) -> bool {
        !matches!(self, Self::Read | Self::RandRead | Self::Flush)
    }
}

/// Settings shared by every job of a run.
#[derive(Debug, Clone)]
pub struct JobSpec {
    /// Pattern.
    pub workload: Workload,
    /// Outstanding I/Os per job.
    pub queue_depth: u32,
    /// Bytes per I/O.
    pub io_size: u32,
    /// Percentage of reads for rw and randrw.
    pub rw_mix_read: u8,
    /// Run time.
    pub duration: std::time::Duration,
    /// Set to end every job early (on SIGINT or SIGTERM).
    pub abort: std::sync::Arc<std::sync::atomic::AtomicBool>,
}
