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
    guard: Some(pool_fits_caches),
    apply: Some(apply),
    ..OptionMethod::new(
        Spec::new("bdev_set_options", "bdev", STARTUP, INVALID_PARAMS, true),
        include_str!("options.schema.json"),
        include_str!("options.defaults.json"),
    )
};

/// SPDK's check (`spdk_bdev_set_opts`): the bdev_io pool must fill every thread's cache, and
/// one more. Inert here, but a config SPDK refuses must not be written by `save_config`.
fn pool_fits_caches(v: &Value) -> Result<(), ferrite_rpc::RpcError> {
    // SPDK's defaults (options.defaults.json) for a member not set.
    let pool = v["bdev_io_pool_size"].as_u64().unwrap_or(65535);
    let cache = v["bdev_io_cache_size"].as_u64().unwrap_or(256);
    let threads = ferrite_reactor::context::current_engine().map_or(1, |e| e.count()) as u64;
    if pool < cache * (threads + 1) {
        return Err(ferrite_rpc::RpcError::new(
            INVALID_PARAMS,
            format!("Pool size {pool} too small for cache size {cache}"),
        ));
    }
    Ok(())
}

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

    #[test]
    fn a_pool_smaller_than_the_caches_is_refused_as_spdk_does() {
        let v = |p: Value| pool_fits_caches(&p);
        let e = v(serde_json::json!({"bdev_io_pool_size": 1, "bdev_io_cache_size": 1000})).unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (-32602, "Pool size 1 too small for cache size 1000"));
        assert!(v(serde_json::json!({"bdev_io_cache_size": 100000})).is_err(), "SPDK's default pool, a huge cache");
        assert!(
            v(serde_json::json!({"bdev_io_pool_size": 65535, "bdev_io_cache_size": 256})).is_ok(),
            "SPDK's defaults"
        );
        assert!(v(serde_json::json!({})).is_ok());
    }
}
