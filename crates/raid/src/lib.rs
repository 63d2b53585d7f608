//! RAID bdevs, as SPDK's module/bdev/raid (v26.05): raid0 (striping), raid1 (mirroring),
//! raid5f (striping with rotating parity, full-stripe writes only) and concat over base bdevs,
//! SPDK's RPCs, SPDK's on-disk superblock (so that a RAID made by SPDK assembles in Ferrite by
//! examine, and the other way round), and the rebuild of a raid1 or raid5f member while I/O
//! goes on.
//!
//! - [`level`]: the levels and how each maps blocks onto members (pure arithmetic).
//! - [`sb`]: the superblock's on-disk format.
//! - [`raid`]: RAIDs and their members: create, configure, register, remove, add, delete.
//! - `channel`: the data path (forward to one member, or fan out to several).
//! - [`xor`]: raid5f's parity (vectorised XOR).
//! - [`process`]: the rebuild ("process") of raid1; `rebuild5f`: of raid5f (from parity).
//! - `examine`: finding RAIDs by their superblocks.
//! - [`rpc`], [`options`]: the JSON-RPC methods.

mod channel;
mod ctl;
mod examine;
pub mod level;
pub mod options;
pub mod process;
pub mod raid;
mod rebuild5f;
pub mod rpc;
pub mod sb;
pub mod xor;

use ferrite_bdev::{Bdev, BdevModule, ExamineDone};
use std::sync::Arc;

struct RaidModule;

impl BdevModule for RaidModule {
    fn name(&self) -> &'static str {
        raid::MODULE
    }

    fn examine_disk(&self, bdev: &Bdev, done: ExamineDone) {
        examine::examine(bdev.clone(), done);
    }
}

/// Registers the RAID module (examine) and its RPC methods.
pub fn register(reg: &mut ferrite_rpc::Registry) {
    register_module();
    rpc::register(reg);
}

/// Registers the RAID module's examine only (for in-process use without RPCs).
pub fn register_module() {
    ferrite_bdev::module::register_module(Arc::new(RaidModule)).expect("the raid module has no init to fail");
}
