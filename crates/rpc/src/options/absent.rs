//! Option methods of modules Ferrite does not have yet: RAID (`bdev_raid_set_options`), the
//! iSCSI initiator (`bdev_iscsi_set_options`) and the iSCSI target (`iscsi_set_options`).
//!
//! They are here only so that SPDK's saved configs, which list them, load unchanged: every
//! member is held to SPDK's default (a few pool sizes of the iSCSI target are inert), and any
//! other value is refused naming the member. When a module's crate exists, its method moves
//! there with its schema and defaults, and says which members it honours.

use super::spec::{OptionMethod, Spec};
use crate::jsonrpc::{INTERNAL_ERROR, INVALID_PARAMS, PARSE_ERROR};
use crate::registry::{RUNTIME, STARTUP};

/// SPDK's schema of these methods.
const SCHEMA: &str = include_str!("absent.schema.json");
/// SPDK's defaults of these methods.
const DEFAULTS: &str = include_str!("absent.defaults.json");

const fn method(spec: Spec) -> OptionMethod {
    OptionMethod::new(spec, SCHEMA, DEFAULTS)
}

/// The option methods of absent modules.
pub static METHODS: [OptionMethod; 3] = [
    method(Spec::new("bdev_raid_set_options", "bdev", STARTUP | RUNTIME, PARSE_ERROR, true)),
    method(Spec::new("bdev_iscsi_set_options", "bdev", STARTUP | RUNTIME, INTERNAL_ERROR, true)),
    OptionMethod {
        inert: &[
            "pdu_pool_size",
            "immediate_data_pool_size",
            "data_out_pool_size",
            "max_large_datain_per_connection",
            "max_r2t_per_connection",
        ],
        ..method(Spec::new("iscsi_set_options", "iscsi", STARTUP, INVALID_PARAMS, true))
    },
];
