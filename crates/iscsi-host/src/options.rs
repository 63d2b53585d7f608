//! `bdev_iscsi_set_options`, with SPDK v26.05's schema and default (`options.schema.json`,
//! `options.defaults.json`): `timeout_sec` (30; 0: none) is what a bdev attached afterwards
//! uses, as SPDK gives libiscsi's context the value at `bdev_iscsi_create`. A command the
//! target has not answered in that time drops its connection (the command is sent again on
//! the next one), and a request that has waited that long for a connection fails. The RPC
//! registry keeps what it set for `save_config`.

use ferrite_rpc::jsonrpc::INTERNAL_ERROR;
use ferrite_rpc::options::{OptionMethod, Spec};
use ferrite_rpc::registry::{RUNTIME, STARTUP};
use ferrite_rpc::Registry;
use serde_json::Value;

/// SPDK's schema of the method.
const SCHEMA: &str = include_str!("options.schema.json");
/// SPDK's defaults of the method.
const DEFAULTS: &str = include_str!("options.defaults.json");

/// SPDK's default `timeout_sec`.
pub const DEFAULT_TIMEOUT_SEC: u64 = 30;

/// `bdev_iscsi_set_options`.
pub static BDEV_ISCSI_SET_OPTIONS: OptionMethod = OptionMethod {
    honoured: &["timeout_sec"],
    ..OptionMethod::new(
        Spec::new("bdev_iscsi_set_options", "bdev", STARTUP | RUNTIME, INTERNAL_ERROR, true),
        SCHEMA,
        DEFAULTS,
    )
};

/// Registers the option method.
pub fn register(reg: &mut Registry) {
    reg.option_method(&BDEV_ISCSI_SET_OPTIONS);
}

/// `timeout_sec` after the calls that left `set` (the merged members of every call so far).
pub fn timeout_sec(set: Option<&Value>) -> u64 {
    set.and_then(|v| v["timeout_sec"].as_u64()).unwrap_or(DEFAULT_TIMEOUT_SEC)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn spdks_schema_and_default_hold_the_honoured_member() {
        BDEV_ISCSI_SET_OPTIONS.validate().unwrap();
        let call = |p: Value| BDEV_ISCSI_SET_OPTIONS.check_call(Some(p));
        assert!(call(json!({"timeout_sec": 5})).is_ok(), "honoured: any value");
        assert!(call(json!({"timeout_sec": 0})).is_ok());
        assert_eq!(call(json!({"timeout_sec": -1})).unwrap_err().code, -32603, "SPDK's decode error");
        assert_eq!(call(json!({"frob": 1})).unwrap_err().code, -32603);
        assert_eq!(BDEV_ISCSI_SET_OPTIONS.check_call(None).unwrap(), json!({}));
        assert_eq!(timeout_sec(None), 30);
        assert_eq!(timeout_sec(Some(&json!({"timeout_sec": 7}))), 7);
    }
}
