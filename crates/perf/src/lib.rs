//! The engine of `ferrite perf`: I/O jobs over bdevs, latency histograms and bdevperf-style reports.

pub mod hist;
pub mod report;
