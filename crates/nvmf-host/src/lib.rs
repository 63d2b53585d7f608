//! Ferrite's NVMe/TCP host: remote NVMe-oF namespaces as bdevs, as SPDK's bdev_nvme does over
//! TCP. No thread of its own: the admin queue runs on the first reactor, each reactor that
//! submits gets its own I/O queue pair.
//!
//! - [`qpair`]: one connection (ICReq, Connect, commands, R2T/H2CData, C2HData);
//! - [`ctrlr`]: a controller (initialization, identify, keep-alive, reconnection, I/O paths);
//! - [`bdev`]: namespaces as bdevs;
//! - [`rpc`]: `bdev_nvme_attach_controller`, `bdev_nvme_detach_controller`,
//!   `bdev_nvme_get_controllers`.

pub mod bdev;
pub mod ctrlr;
pub mod qpair;
pub mod rpc;
