//! FUSE export: a bdev appears as a regular file at a path (like qemu-storage-daemon's FUSE
//! export). Reads, writes, fsync and fallocate become bdev read, write, flush, unmap and write
//! zeroes; `losetup` on the file gives the host a block device.

pub mod file;
pub mod range_lock;
pub mod rpc;
