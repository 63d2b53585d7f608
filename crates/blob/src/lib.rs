//! Ferrite's blobstore (SPDK's `lib/blob`), in SPDK's on-disk format.
//!
//! - [`format`]: the on-disk structures of SPDK v26.05's blobstore (super block, masks, metadata
//!   pages, descriptors, extent pages), decoded to and encoded from typed structs without any
//!   I/O, so that a device written by SPDK opens in Ferrite and the other way round.
//! - [`lvol`]: what SPDK's lvol layer keeps in blob xattrs (names, uuids).
//! - [`offline`]: reads a whole image through a tiny [`offline::ReadAt`] trait, dumps it and
//!   checks its consistency (`ferrite blobstore dump|check`).
//! - [`store`]: the runtime blobstore: what a loaded blobstore keeps in memory and how it
//!   changes on the device.

#![warn(missing_docs)]

pub mod format;
pub mod lvol;
pub mod offline;
pub mod store;
