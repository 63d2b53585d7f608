//! The runtime blobstore: what a loaded blobstore keeps in memory and how it changes.

pub mod bits;
pub mod clusters;
pub mod layout;
