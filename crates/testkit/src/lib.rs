//! Devices that exist for tests only, kept out of the product's crates: the crash disk, a bdev
//! with a volatile write cache whose power a test cuts ([`crash_disk`]).

#![warn(missing_docs)]

pub mod crash_disk;
