//! The NVMe/TCP transport (NVMe/TCP transport specification, NVMe-oF 1.1).

#![warn(missing_docs)]

pub mod digest;
