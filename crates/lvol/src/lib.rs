//! Logical volumes (SPDK's `lib/lvol` and `module/bdev/lvol`): an lvstore is a blobstore of
//! type `LVOLSTORE` on a base bdev, named by xattrs of its super blob; each lvol is a blob,
//! named by its own xattrs, served as a bdev named by its UUID with the alias
//! `<lvs name>/<lvol name>`. Lvstores on a bdev are found by examine when it registers (there
//! is no lvol entry in a saved config, as in SPDK).
//!
//! - [`lvs`]: lvstores and lvols: create, load (examine), delete, resize.
//! - [`bdev`]: the lvol bdev and its per-core channel (cluster translation, thin allocation).
//! - [`rpc`]: SPDK's `bdev_lvol_*` methods.
//! - [`xattr`]: what SPDK's lvol layer keeps in blob xattrs (names, uuids).

#![warn(missing_docs)]

pub mod bdev;
pub mod lvs;
pub mod rpc;
pub mod xattr;

use ferrite_bdev::{Bdev, BdevModule, ExamineDone};
use std::sync::Arc;

/// Module name (claims, `bdev_get_bdevs`).
pub const MODULE: &str = "lvol";

struct LvolModule;

impl BdevModule for LvolModule {
    fn name(&self) -> &'static str {
        MODULE
    }

    fn examine_disk(&self, bdev: &Bdev, done: ExamineDone) {
        lvs::examine(bdev.clone(), done);
    }
}

/// Registers the lvol module (examine) and its RPC methods.
pub fn register(reg: &mut ferrite_rpc::Registry) {
    ferrite_bdev::module::register_module(Arc::new(LvolModule)).expect("the lvol module has no init to fail");
    rpc::register(reg);
}
