//! Ferrite's block device layer: a registry of named bdevs, open descriptors with exclusive write
//! claims, per-core I/O channels created lazily, request checking, statistics, hot removal, and
//! the base modules (null, malloc, uring).

pub mod bdev;
pub mod channel;
pub mod desc;
pub mod io;
pub mod modules;
pub mod rpc;
pub mod stats;

pub use bdev::{list, lookup, register, unregister, BackendChannel, Bdev, BdevBackend, BdevError, BdevProps};
pub use channel::IoChannel;
pub use desc::BdevDesc;
pub use io::{BdevIo, Completed, IoCompleter, IoRequest, IoStatus, IoType, IoTypes};
pub use stats::IoStat;
