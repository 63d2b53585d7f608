//! What an option call may set here. SPDK's saved configs list every option with its value, and
//! they must keep loading unchanged; but an option that would change behaviour Ferrite does not
//! have must not be taken silently, or its caller believes in a feature that is not there. So
//! each member of an option method is one of:
//! - *honoured*: a crate of Ferrite acts on it, and says so in the method's definition
//!   ([`super::OptionMethod::honoured`]): any valid value;
//! - *inert*: it tunes SPDK machinery that has no counterpart here and whose value changes
//!   nothing anyone can observe (pool and cache sizes, poll periods, RDMA-only and PCIe-only
//!   knobs; [`super::OptionMethod::inert`]): any valid value, kept for `save_config`;
//! - anything else: only SPDK v26.05's default value (the definition's defaults, taken from
//!   `spdk_tgt`'s own `save_config`) is accepted; another value is refused with an error that
//!   names the member.

use super::spec::Defined;
use crate::jsonrpc::{RpcError, INVALID_PARAMS};
use serde_json::Value;

/// True if `v` is the default `d`: an object is when each member it gives is (SPDK decodes a
/// partial object over the defaults).
fn same_as_default(v: &Value, d: &Value) -> bool {
    match (v, d) {
        (Value::Object(vm), Value::Object(dm)) => {
            vm.iter().all(|(k, vv)| dm.get(k).is_some_and(|dv| same_as_default(vv, dv)))
        }
        _ => v == d,
    }
}

/// Checks each member of a call of `m`: honoured, inert, the instance key, or SPDK's default;
/// the first other one is refused, by name.
pub fn check(m: &Defined, params: &Value) -> Result<(), RpcError> {
    let Some(obj) = params.as_object() else { return Ok(()) };
    let spec = m.spec();
    let key = spec.key.and_then(|k| params[k].as_str());
    let inert = |field: &str| m.def.inert.iter().any(|f| *f == "*" || *f == field);
    for (field, v) in obj {
        if Some(field.as_str()) == spec.key || m.def.honoured.contains(&field.as_str()) || inert(field) {
            continue;
        }
        match m.default_of(key, field) {
            Some(d) if same_as_default(v, d) => {}
            Some(d) => {
                return Err(RpcError::new(
                    INVALID_PARAMS,
                    format!(
                        "{}: {field} = {v} would change behaviour Ferrite does not have; only SPDK's default ({d}) is accepted",
                        spec.method
                    ),
                ))
            }
            None => {
                return Err(RpcError::new(
                    INVALID_PARAMS,
                    format!("{}: {field} is not supported by Ferrite (it has no such behaviour)", spec.method),
                ))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jsonrpc::INVALID_PARAMS;
    use crate::options::{absent, framework, OptionMethod, Spec};
    use serde_json::json;

    fn defined(m: &str) -> Defined {
        Defined::parse(framework::METHODS.iter().chain(&absent::METHODS).find(|d| d.spec.method == m).unwrap()).unwrap()
    }

    /// A method with an honoured member, an inert one, one held to its default and an object.
    static TEST: OptionMethod = OptionMethod {
        honoured: &["timeout_us"],
        inert: &["pool_size"],
        ..OptionMethod::new(
            Spec::new("test_set_options", "bdev", crate::registry::STARTUP, INVALID_PARAMS, true),
            r#"{"methods": {"test_set_options": {"timeout_us": {"type": "uint64"}, "pool_size": {"type": "uint32"},
                "generate_uuids": {"type": "boolean"}, "extra": {"type": "boolean"},
                "passthru": {"type": "object", "class": "passthru"}}},
                "objects": {"passthru": {"identify_ctrlr": {"type": "boolean"}, "fw_update": {"type": "boolean"}}}}"#,
            r#"{"defaults": {"test_set_options": {"timeout_us": 0, "pool_size": 64, "generate_uuids": false,
                "passthru": {"identify_ctrlr": false, "fw_update": false}}}}"#,
        )
    };

    #[test]
    fn spdks_defaults_pass_and_other_values_are_refused_by_name() {
        let keyring = defined("keyring_linux_set_options");
        assert!(check(&keyring, &json!({"enable": false})).is_ok());
        let e = check(&keyring, &json!({"enable": true})).unwrap_err();
        assert_eq!(e.code, INVALID_PARAMS);
        assert!(e.message.contains("enable"), "{}", e.message);
    }

    #[test]
    fn inert_and_honoured_members_take_any_value() {
        let sock = defined("sock_impl_set_options");
        assert!(check(&sock, &json!({"impl_name": "posix", "recv_buf_size": 65536})).is_ok());
        let t = Defined::parse(&TEST).unwrap();
        assert!(check(&t, &json!({"pool_size": 4096})).is_ok(), "inert");
        assert!(check(&t, &json!({"timeout_us": 5})).is_ok(), "honoured");
        let e = check(&t, &json!({"generate_uuids": true})).unwrap_err();
        assert!(e.message.contains("generate_uuids") && e.message.contains("default (false)"), "{}", e.message);
        assert!(check(&t, &json!({"extra": false})).unwrap_err().message.contains("extra is not supported"));
        assert!(check(&t, &json!({"passthru": {"identify_ctrlr": false}})).is_ok(), "a partial default");
        assert!(check(&t, &json!({"passthru": {"identify_ctrlr": true}})).is_err());
    }

    #[test]
    fn validation_finds_members_outside_the_schema_and_defaults_it_refuses() {
        TEST.validate().unwrap();
        static UNKNOWN: OptionMethod =
            OptionMethod { honoured: &["nope"], ..OptionMethod::new(TEST.spec, TEST.schema, TEST.defaults) };
        assert!(UNKNOWN.validate().unwrap_err().contains("nope"));
        static ILL: OptionMethod = OptionMethod::new(
            Spec::new("test_set_options", "bdev", crate::registry::STARTUP, INVALID_PARAMS, true),
            r#"{"methods": {"test_set_options": {"n": {"type": "uint8"}}}}"#,
            r#"{"defaults": {"test_set_options": {"n": 300}}}"#,
        );
        assert!(ILL.validate().unwrap_err().contains("300"));
        static NO_DEFAULTS: OptionMethod = OptionMethod::new(TEST.spec, TEST.schema, r#"{"defaults": {}}"#);
        assert!(NO_DEFAULTS.validate().is_err());
    }
}
