//! Parameters SPDK v26.05's save_config writes for bdev modules that Ferrite's module decoders
//! (crates/bdev) do not know yet. They are dropped here when they hold SPDK's default (so an
//! unmodified SPDK config loads) and refused with a clear message otherwise (Ferrite cannot
//! honour them). Remove an entry once the module's decoder accepts the parameter itself.

use crate::jsonrpc::{RpcError, INVALID_PARAMS};
use crate::registry::Params;
use serde_json::{json, Value};

/// (method, parameter, the default SPDK writes).
fn defaults() -> [(&'static str, &'static str, Value); 6] {
    [
        ("bdev_malloc_create", "numa_id", json!(-1)),
        ("bdev_null_create", "preferred_write_granularity", json!(0)),
        ("bdev_null_create", "preferred_write_alignment", json!(0)),
        ("bdev_null_create", "optimal_write_size", json!(0)),
        ("bdev_null_create", "preferred_unmap_granularity", json!(0)),
        ("bdev_null_create", "preferred_unmap_alignment", json!(0)),
    ]
}

/// Drops SPDK-only parameters that hold their default; refuses other values.
pub fn adapt(method: &str, params: Params) -> Result<Params, RpcError> {
    let Params(Some(Value::Object(mut obj))) = params else { return Ok(params) };
    for (m, key, default) in defaults() {
        if m != method {
            continue;
        }
        match obj.get(key) {
            None => {}
            Some(v) if *v == default => {
                obj.remove(key);
            }
            Some(v) => {
                return Err(RpcError::new(
                    INVALID_PARAMS,
                    format!("Invalid parameters: {key} = {v} is not supported (only {default})"),
                ))
            }
        }
    }
    Ok(Params(Some(Value::Object(obj))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_dropped_others_refused() {
        let p = adapt("bdev_malloc_create", Params(Some(json!({"name": "M", "numa_id": -1})))).unwrap();
        assert_eq!(p.0, Some(json!({"name": "M"})));
        assert!(adapt("bdev_malloc_create", Params(Some(json!({"numa_id": 1})))).is_err());
        let p = adapt("bdev_uring_create", Params(Some(json!({"numa_id": 3})))).unwrap();
        assert_eq!(p.0, Some(json!({"numa_id": 3})));
        assert!(adapt("bdev_null_create", Params(None)).unwrap().0.is_none());
    }
}
