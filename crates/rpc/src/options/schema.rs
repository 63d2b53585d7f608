//! Parameter checking against SPDK's own machine-readable RPC schema (`schema/schema.json` of
//! SPDK v26.05, the entries of the option methods, in `spdk_schema.json`), with the rules of
//! SPDK's JSON decoders: unknown members and wrong types are refused, integers must fit their
//! type exactly, enums are matched exactly.

use serde_json::{Map, Value};
use std::sync::OnceLock;

/// The embedded schema subset.
fn schema() -> &'static Value {
    static S: OnceLock<Value> = OnceLock::new();
    S.get_or_init(|| serde_json::from_str(include_str!("spdk_schema.json")).expect("spdk_schema.json is valid JSON"))
}

/// The parameter table of `method` (name → {type, class?, required?}), if the schema has it.
pub fn params_of(method: &str) -> Option<&'static Map<String, Value>> {
    schema()["methods"][method].as_object()
}

/// Checks `params` (an object) against the table `fields`; `relaxed` ignores unknown members
/// (SPDK's spdk_json_decode_object_relaxed). Returns what is wrong.
pub fn check_object(params: &Value, fields: &Map<String, Value>, relaxed: bool) -> Result<(), String> {
    let obj = params.as_object().ok_or("params must be an object")?;
    for (k, v) in obj {
        match fields.get(k) {
            Some(f) => check_value(v, f).map_err(|e| format!("{k}: {e}"))?,
            None if relaxed => {}
            None => return Err(format!("unknown parameter {k:?}")),
        }
    }
    for (k, f) in fields {
        if f["required"] == true && !obj.contains_key(k) {
            return Err(format!("missing parameter {k:?}"));
        }
    }
    Ok(())
}

fn check_value(v: &Value, field: &Value) -> Result<(), String> {
    let class = field["class"].as_str().unwrap_or("");
    let ty = field["type"].as_str().unwrap_or("");
    let uint = |max: u64| match v.as_u64() {
        Some(n) if n <= max => Ok(()),
        _ => Err(format!("expected an integer from 0 to {max}, got {v}")),
    };
    match ty {
        "uint8" => uint(u8::MAX as u64),
        "uint16" => uint(u16::MAX as u64),
        "uint32" => uint(u32::MAX as u64),
        "uint64" => uint(u64::MAX),
        "int32" => match v.as_i64() {
            Some(n) if i32::try_from(n).is_ok() => Ok(()),
            _ => Err(format!("expected a 32-bit integer, got {v}")),
        },
        "boolean" => v.is_boolean().then_some(()).ok_or_else(|| format!("expected true or false, got {v}")),
        "string" => v.is_string().then_some(()).ok_or_else(|| format!("expected a string, got {v}")),
        "enum" => check_enum(v, class),
        "object" => {
            let fields = schema()["objects"][class].as_object().ok_or_else(|| format!("no object class {class}"))?;
            check_object(v, fields, false)
        }
        "array" => {
            let spec = &schema()["arrays"][class];
            let items = v.as_array().ok_or_else(|| format!("expected an array, got {v}"))?;
            if let Some(max) = spec["max_count"].as_u64() {
                if items.len() as u64 > max {
                    return Err(format!("at most {max} items"));
                }
            }
            let item_class = spec["class"].as_str().unwrap_or("");
            items.iter().try_for_each(|i| check_enum(i, item_class))
        }
        other => Err(format!("unsupported schema type {other}")),
    }
}

fn check_enum(v: &Value, class: &str) -> Result<(), String> {
    let names = schema()["enums"][class].as_array().ok_or_else(|| format!("no enum {class}"))?;
    match v.as_str() {
        Some(s) if names.iter().any(|n| n == s) => Ok(()),
        _ => Err(format!("expected one of {}, got {v}", Value::Array(names.clone()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn spdk_decoder_rules() {
        let f = params_of("bdev_nvme_set_options").unwrap();
        assert!(check_object(&json!({"timeout_us": 0, "action_on_timeout": "abort"}), f, false).is_ok());
        assert!(check_object(&json!({"transport_ack_timeout": 256}), f, false).is_err());
        assert!(check_object(&json!({"keep_alive_timeout_ms": -1}), f, false).is_err());
        assert!(check_object(&json!({"keep_alive_timeout_ms": 1.5}), f, false).is_err());
        assert!(check_object(&json!({"bdev_retry_count": -1}), f, false).is_ok());
        assert!(check_object(&json!({"action_on_timeout": "explode"}), f, false).is_err());
        assert!(check_object(&json!({"dhchap_digests": ["sha256", "md5"]}), f, false).is_err());
        assert!(check_object(&json!({"multipath_opts": {"policy": "active_active", "x": 1}}), f, false).is_err());
        assert!(check_object(&json!({"frob": 1}), f, false).unwrap_err().contains("frob"));
        assert!(check_object(&json!({"frob": 1}), f, true).is_ok());
        assert!(check_object(&json!([1]), f, false).is_err());
        let h = params_of("bdev_nvme_set_hotplug").unwrap();
        assert!(check_object(&json!({"period_us": 5}), h, false).unwrap_err().contains("enable"));
    }
}
