//! The NVMe-oF target's SPDK option methods: `nvmf_set_max_subsystems` bounds the subsystems
//! `nvmf_create_subsystem` makes (read back by [`super::rpc`]); `nvmf_set_config` and
//! `nvmf_set_crdt` are held to SPDK's defaults, but for the poll group mask and the
//! DH-HMAC-CHAP choices (inert without authentication). SPDK's schema and defaults of the three
//! are `options.schema.json` and `options.defaults.json`; the RPC registry keeps what they set.

use ferrite_rpc::jsonrpc::INVALID_PARAMS;
use ferrite_rpc::options::{OptionMethod, Spec};
use ferrite_rpc::registry::STARTUP;
use ferrite_rpc::{Registry, RpcError};
use serde_json::Value;

/// SPDK's schema of the methods.
const SCHEMA: &str = include_str!("options.schema.json");
/// SPDK's defaults of the methods.
const DEFAULTS: &str = include_str!("options.defaults.json");

/// `match_any`, or a comma-separated list of transport, address, svcid (SPDK's
/// decode_discovery_filter).
fn discovery_filter(p: &Value) -> Result<(), RpcError> {
    let Some(f) = p.get("discovery_filter").and_then(Value::as_str) else { return Ok(()) };
    let ok = f == "match_any" || f.split(',').all(|t| matches!(t, "transport" | "address" | "svcid"));
    if ok {
        Ok(())
    } else {
        Err(RpcError::new(INVALID_PARAMS, format!("Invalid parameters: discovery_filter {f:?}")))
    }
}

/// SPDK's checks of `nvmf_set_config`: the discovery filter, and a poll group mask that is a
/// core mask (SPDK's `spdk_cpuset_parse`) of cores the framework runs on (SPDK refuses one
/// outside its core mask when it decodes the call).
fn config_check(p: &Value) -> Result<(), RpcError> {
    discovery_filter(p)?;
    let Some(mask) = p.get("poll_groups_mask").and_then(Value::as_str) else { return Ok(()) };
    let cores = ferrite_reactor::cpumask::parse_cpumask(mask)
        .map_err(|e| RpcError::new(INVALID_PARAMS, format!("Invalid parameters: poll_groups_mask: {e}")))?;
    let count = ferrite_reactor::context::current_engine().map(|e| e.count());
    if let (Some(n), Some(&last)) = (count, cores.last()) {
        if last >= n {
            return Err(RpcError::new(
                INVALID_PARAMS,
                format!(
                    "Invalid parameters: poll_groups_mask {mask:?} names core {last}, outside the {n} cores running"
                ),
            ));
        }
    }
    Ok(())
}

/// `nvmf_set_config`.
pub static NVMF_SET_CONFIG: OptionMethod = OptionMethod {
    inert: &["poll_groups_mask", "dhchap_digests", "dhchap_dhgroups"],
    ..OptionMethod::new(
        Spec { check: Some(config_check), ..Spec::new("nvmf_set_config", "nvmf", STARTUP, INVALID_PARAMS, true) },
        SCHEMA,
        DEFAULTS,
    )
};

/// `nvmf_set_max_subsystems`: the target acts on it when a subsystem is created.
pub static NVMF_SET_MAX_SUBSYSTEMS: OptionMethod = OptionMethod {
    honoured: &["max_subsystems"],
    ..OptionMethod::new(Spec::new("nvmf_set_max_subsystems", "nvmf", STARTUP, INVALID_PARAMS, true), SCHEMA, DEFAULTS)
};

/// `nvmf_set_crdt`: the command retry delay times, zero here (no retry delays are advertised).
pub static NVMF_SET_CRDT: OptionMethod =
    OptionMethod::new(Spec::new("nvmf_set_crdt", "nvmf", STARTUP, INVALID_PARAMS, true), SCHEMA, DEFAULTS);

/// Registers the option methods.
pub fn register(reg: &mut Registry) {
    for m in [&NVMF_SET_CONFIG, &NVMF_SET_MAX_SUBSYSTEMS, &NVMF_SET_CRDT] {
        reg.option_method(m);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn spdks_schema_and_defaults_cover_the_honoured_members() {
        for m in [&NVMF_SET_CONFIG, &NVMF_SET_MAX_SUBSYSTEMS, &NVMF_SET_CRDT] {
            m.validate().unwrap_or_else(|e| panic!("{e}"));
        }
    }

    #[test]
    fn calls_are_checked_as_spdk_and_ferrite_do() {
        let config = |p: Value| NVMF_SET_CONFIG.check_call(Some(p));
        assert!(config(json!({"discovery_filter": "transport,svcid"})).is_err(), "not SPDK's default");
        assert!(config(json!({"discovery_filter": "match_any", "poll_groups_mask": "0x3"})).is_ok());
        for bad in ["zz", "", "0x", "[5-2]"] {
            let e = config(json!({"poll_groups_mask": bad})).unwrap_err();
            assert!(e.code == -32602 && e.message.contains("poll_groups_mask"), "{bad:?}: {e:?}");
        }
        let e = config(json!({"discovery_filter": "everything"})).unwrap_err();
        assert!(e.code == -32602 && e.message.contains("discovery_filter"), "{e:?}");
        assert!(config(json!({"admin_cmd_passthru": {"identify_ctrlr": false}})).is_ok(), "a partial default");
        assert!(config(json!({"admin_cmd_passthru": {"identify_ctrlr": true}}))
            .unwrap_err()
            .message
            .contains("admin_cmd_passthru"));
        assert!(NVMF_SET_MAX_SUBSYSTEMS.check_call(Some(json!({"max_subsystems": 4}))).is_ok(), "honoured");
        assert!(NVMF_SET_MAX_SUBSYSTEMS.check_call(Some(json!({}))).is_err(), "max_subsystems is required");
        assert!(NVMF_SET_CRDT.check_call(Some(json!({"crdt1": 5}))).unwrap_err().message.contains("crdt1"));
        assert!(NVMF_SET_CRDT.check_call(None).is_ok(), "params are optional");
    }
}
