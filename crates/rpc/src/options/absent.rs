//! Option methods of modules Ferrite does not have yet: RAID (`bdev_raid_set_options`).
//!
//! They are here only so that SPDK's saved configs, which list them, load unchanged: every
//! member is held to SPDK's default, and any other value is refused naming the member. When a
//! module's crate exists, its method moves there with its schema and defaults, and says which
//! members it honours (the iSCSI target's `iscsi_set_options` did: crates/iscsi-target; so did
//! the iSCSI initiator's `bdev_iscsi_set_options`: crates/iscsi-host).

use super::spec::{OptionMethod, Spec};
use crate::jsonrpc::PARSE_ERROR;
use crate::registry::{RUNTIME, STARTUP};

/// SPDK's schema of these methods.
const SCHEMA: &str = include_str!("absent.schema.json");
/// SPDK's defaults of these methods.
const DEFAULTS: &str = include_str!("absent.defaults.json");

const fn method(spec: Spec) -> OptionMethod {
    OptionMethod::new(spec, SCHEMA, DEFAULTS)
}

/// The option methods of absent modules.
pub static METHODS: [OptionMethod; 1] =
    [method(Spec::new("bdev_raid_set_options", "bdev", STARTUP | RUNTIME, PARSE_ERROR, true))];
