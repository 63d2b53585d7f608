//! virtio-user bdev: a vhost-user-blk front end in user space, as SPDK's `bdev_virtio` with
//! trtype "user". Ferrite connects to a vhost-user-blk socket (Ferrite's own vhost target,
//! SPDK's `vhost` app, qemu-storage-daemon's export), shares a memfd with the device as its
//! guest memory, and drives its virtqueues from reactor pollers.
//!
//! - [`shm`]: the shared region (memfd; 2 MiB hugepages when the kernel has them, which SPDK's
//!   vhost target needs, else 4 KiB pages);
//! - [`ring`]: the driver side of a split virtqueue;
//! - [`handshake`]: the vhost-user setup (features, configuration, memory table, rings);
//! - [`queue`]: virtio-blk requests on a queue, with bounce buffers in the shared region;
//! - [`bdev`]: the device as a bdev, its channels and pollers;
//! - [`rpc`]: `bdev_virtio_attach_controller`, `bdev_virtio_detach_controller`.

pub mod bdev;
pub mod handshake;
pub mod queue;
pub mod ring;
pub mod rpc;
pub mod shm;

pub use bdev::{attach, AttachOpts, Device};
