//! Ferrite's blobstore (SPDK's `lib/blob`), in SPDK's on-disk format.
//!
//! - [`format`]: the on-disk structures of SPDK v26.05's blobstore (super block, masks, metadata
//!   pages, descriptors, extent pages), decoded to and encoded from typed structs without any
//!   I/O, so that a device written by SPDK opens in Ferrite and the other way round.
//! - [`offline`]: reads a whole image through a tiny [`offline::ReadAt`] trait, dumps it and
//!   checks its consistency (`ferrite blobstore dump|check`).
//! - [`store`]: the runtime blobstore: what a loaded blobstore keeps in memory and how it
//!   changes on the device.
//!
//! What the lvol layer keeps in a blob (its name and uuid xattrs) is the lvol crate's business:
//! the blobstore stores xattrs without knowing them.

#![warn(missing_docs)]

pub mod format;
pub mod offline;
pub mod store;
