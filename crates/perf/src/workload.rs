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
    /// Random compare-and-writes: each unit's blocks are compared with what the job last wrote
    /// there and replaced by the next version (a unit's first touch is a plain write); a
    /// miscompare counts as a data mismatch.
    CompareAndWrite,
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
            "compare_and_write" => Self::CompareAndWrite,
            _ => {
                return Err(format!(
                "unknown workload {s:?} (read, write, randread, randwrite, rw, randrw, verify, reset, unmap, flush, \
                     compare_and_write)"
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
            Self::CompareAndWrite => "compare_and_write",
        }
    }

    /// True if offsets are random.
    pub fn random(self) -> bool {
        matches!(self, Self::RandRead | Self::RandWrite | Self::RandRw | Self::CompareAndWrite)
    }

    /// True if a slot keeps its I/O unit to itself until its pair of requests is over
    /// (verify's write and read-back; a compare-and-write's unit, whose version it knows).
    pub fn owns_units(self) -> bool {
        self.verifies() || self == Self::CompareAndWrite
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

/// The workloads of a run's cores: `-w a,b` gives core 0 workload a, core 1 b, core 2 a, ...
/// (one name: every core runs it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workloads(pub Vec<Workload>);

impl std::str::FromStr for Workloads {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        s.split(',').map(|w| w.trim().parse()).collect::<Result<Vec<_>, _>>().map(Workloads)
    }
}

impl JobSpec {
    /// The spec of the run's `i`th core.
    pub fn for_core(&self, i: usize) -> JobSpec {
        let mut s = self.clone();
        if !self.per_core.is_empty() {
            s.workload = self.per_core[i % self.per_core.len()];
        }
        s
    }
}

impl Workloads {
    /// The workload of the `i`th core of the run.
    pub fn of_core(&self, i: usize) -> Workload {
        self.0[i % self.0.len()]
    }
}

/// Settings shared by every job of a run.
#[derive(Debug, Clone)]
pub struct JobSpec {
    /// Pattern (of every core, unless `per_core` names others).
    pub workload: Workload,
    /// The workloads of the run's cores, by index, when they differ (`-w a,b`; see
    /// [`Workloads`]); empty: every core runs `workload`.
    pub per_core: Vec<Workload>,
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
