//! The NVMe-oF target over TCP: subsystems of namespaces (any bdev), exported to hosts.
//!
//! - [`model`]: the configuration (transport options, subsystems, namespaces, hosts,
//!   listeners with ANA states, referrals), one per engine;
//! - [`ctrlr`]: a controller, shared by its queue pairs across reactors;
//! - `listen`: the TCP listeners (accept on the first reactor, queue pairs round robin);
//! - `qpair`: one connection, its receive and send tasks (receiving through [`crate::rx`]);
//! - `exec`: capsule checks and Fabrics commands; `admin` and `io` the other commands;
//! - `resv`: the reservation commands, the conflict check of I/O and the notification log;
//! - [`rpc`]: SPDK's `nvmf_*` methods and the "nvmf" config subsystem.

pub mod ctrlr;
pub mod model;
pub mod options;
pub mod rpc;

mod admin;
mod exec;
mod io;
mod listen;
mod qpair;
mod resv;

pub use qpair::QpairInfo;
