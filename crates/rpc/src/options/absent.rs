//! Option methods of modules Ferrite does not have yet: none now.
//!
//! Such a method would be here only so that SPDK's saved configs, which list it, load
//! unchanged: every member held to SPDK's default, and any other value refused naming the
//! member. When a module's crate exists, its method moves there with its schema and defaults,
//! and says which members it honours (the iSCSI target's `iscsi_set_options` did:
//! crates/iscsi-target; so did the iSCSI initiator's `bdev_iscsi_set_options`:
//! crates/iscsi-host, and RAID's `bdev_raid_set_options`: crates/raid).

use super::spec::OptionMethod;

/// The option methods of absent modules.
pub static METHODS: [OptionMethod; 0] = [];
