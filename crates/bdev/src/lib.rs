//! Ferrite's block device layer: a registry of named bdevs, open descriptors with exclusive write
//! claims, per-core I/O channels created lazily, request checking, statistics, hot removal, and
//! the base modules (null, malloc, uring).

pub mod bdev;
pub mod channel;
mod compare;
pub mod copy;
pub use compare::first_difference;
mod local_locks;
mod range_lock;
pub use range_lock::{LbaRangeLock, LockStats};
pub mod desc;
pub mod fanout;
mod fit;
pub mod histogram;
pub mod io;
pub mod lifecycle;
pub mod module;
pub mod options;
pub mod qos;
pub mod reservation;
pub mod rpc;
pub mod snapshot;
pub mod stats;
pub mod timeout;
pub mod translate;

pub use bdev::{
    list, lookup, register, stacked_over, unregister, BackendChannel, Bdev, BdevBackend, BdevError, BdevProps, Limits,
    LinearMap,
};
pub use channel::IoChannel;
pub use desc::{BdevDesc, BdevEvent, ClaimType, MediaEvent};
pub use fanout::{FanOut, FanOutCompleter, FanOutDone};
pub use io::{
    BdevIo, Completed, DiffOffset, IoAux, IoBufs, IoCompleter, IoFlags, IoRequest, IoState, IoStatus, IoType, IoTypes,
    NvmeCmd,
};
pub use lifecycle::Destructed;
pub use module::{BdevModule, ExamineDone};
pub use reservation::{Access, Initiator, InitiatorId, InitiatorRef, Reservations, ResvError, ResvType};
pub use stats::IoStat;
