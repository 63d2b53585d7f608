//! The blobstore (SPDK's `lib/blob`): blobs of clusters on a block device, in SPDK's on-disk
//! format.

pub mod store;
