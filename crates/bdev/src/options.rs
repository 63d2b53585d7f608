//! `bdev_set_options`, the bdev layer's SPDK option method: `bdev_auto_examine` switches the
//! examination of new bdevs ([`crate::module::set_auto_examine`]); the pool and cache sizes
//! tune SPDK's bdev_io pools, which have no counterpart here (inert); SPDK's schema and defaults
//! of the method are `options.schema.json` and `options.defaults.json`.

use ferrite_rpc::jsonrpc::INVALID_PARAMS;
use ferrite_rpc::options::{OptionMethod, Spec};
use ferrite_rpc::registry::STARTUP;
use serde_json::Value;

/// `bdev_set_options`, as [`crate::rpc::register`] registers it.
pub static BDEV_SET_OPTIONS: OptionMethod = OptionMethod {
    honoured: &["bdev_auto_examine"],
    inert: &["bdev_io_pool_size", "bdev_io_cache_size", "iobuf_small_cache_size", "iobuf_large_cache_size"],
    apply: Some(apply),
    ..OptionMethod::new(
        Spec::new("bdev_set_options", "bdev", STARTUP, INVALID_PARAMS, true),
        include_str!("options.schema.json"),
        include_str!("options.defaults.json"),
    )
};

/// Acts on what `bdev_set_options` has set.
fn apply(v: &Value) {
    if let Some(on) = v["bdev_auto_examine"].as_bool() {
        crate::module::set_auto_examine(on);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spdks_schema_and_defaults_cover_the_honoured_members() {
        BDEV_SET_OPTIONS.validate().unwrap();
    }
}
