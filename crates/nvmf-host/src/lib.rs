//! Ferrite's NVMe/TCP host: remote NVMe-oF namespaces as bdevs, as SPDK's bdev_nvme does over
//! TCP. No thread of its own: the admin queues run on the first reactor, each reactor that
//! submits gets its own I/O queue pair per controller.
//!
//! - [`qpair`]: one connection (ICReq, Connect, commands, R2T/H2CData, C2HData);
//! - [`ctrlr`]: a controller (initialization, identify, keep-alive, reconnection, failover
//!   between its paths);
//! - [`path`]: a reactor's I/O queue pair to a controller;
//! - [`ana`]: ANA states from the ANA log page and ANA change notices;
//! - [`group`]: the controllers and bdevs of a name (failover paths, multipath controllers);
//! - [`bdev`]: namespaces as bdevs; [`channel`]: their channels, which choose the path;
//! - [`abort`]: abort of an outstanding request;
//! - [`trid`]: a path (transport ID);
//! - [`options`]: what `bdev_nvme_set_options` sets (attach defaults, command timeouts);
//! - [`rpc`]: `bdev_nvme_attach_controller`, `bdev_nvme_detach_controller`,
//!   `bdev_nvme_get_controllers`, `bdev_nvme_set_multipath_policy`.

mod abort;
pub mod ana;
pub mod bdev;
mod channel;
pub mod ctrlr;
pub mod group;
pub mod options;
pub mod path;
pub mod qpair;
pub mod rpc;
pub mod trid;
