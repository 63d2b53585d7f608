//! The engine of `ferrite perf`: I/O jobs over bdevs, latency histograms and bdevperf-style reports.

pub mod caw;
pub mod fill;
pub mod hist;
pub mod job;
pub mod report;
pub mod workload;

pub use fill::fill;
pub use job::{start, JobPlacement, Progress};
pub use report::JobResult;
pub use workload::{JobSpec, Workload, Workloads};
