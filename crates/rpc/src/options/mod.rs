//! SPDK's option methods (`*_set_options`, `nvmf_set_config`, `framework_set_scheduler`, ...) as
//! real RPCs: SPDK's parameter schemas, RPC states and decode-error codes; what a call sets is
//! kept ([`Settings`]) and written back by `framework_get_config`/`save_config` in its
//! subsystem, so a config round-trips without loss.
//!
//! Each member is honoured (a crate acts on it and says so), inert (it tunes SPDK machinery
//! without a counterpart here, and any value changes nothing observable), or held to SPDK's
//! default: another value is refused by name ([`policy`]), so that a saved SPDK config loads
//! unchanged and no call makes its caller believe in a behaviour Ferrite does not have. The
//! scheduler must be `static` (threads never move between reactors), socket implementations
//! must be ones SPDK knows, and `iobuf_set_options` sizes the reactors' buffer pools when the
//! framework starts ([`iobuf`]).

pub mod iobuf;
pub mod policy;
mod schema;
mod settings;
mod specs;

pub use settings::{Guard, Settings};
pub use specs::{Spec, SPECS};

use crate::jsonrpc::{RpcError, INTERNAL_ERROR, INVALID_PARAMS};
use crate::registry::{Params, Registry, RUNTIME, STARTUP};
use serde_json::{json, Value};

/// Subsystems that exist here only to hold options (listed like SPDK's, in SPDK's order, around
/// the ones Ferrite's modules register).
pub const LEADING_SUBSYSTEMS: &[&str] = &["scheduler", "vmd", "sock", "iobuf", "keyring", "fsdev", "accel"];
/// Option-only subsystems listed after the modules' ones.
pub const TRAILING_SUBSYSTEMS: &[&str] = &["nvmf", "iscsi"];

/// Registers every option method, `framework_get_scheduler` and `vmd_enable`.
pub fn register(reg: &mut Registry) {
    // What the framework itself acts on: the reactors' buffer pools (`iobuf`).
    reg.settings()
        .honour("iobuf_set_options", &["small_pool_count", "large_pool_count", "small_bufsize", "large_bufsize"]);
    for spec in SPECS {
        reg.method_in(spec.method, spec.states, move |ctx, p: Params| async move {
            let params = decode(spec, p)?;
            if let Some(check) = spec.check {
                check(&params)?;
            }
            let honoured = ctx.registry.settings().honoured(spec.method);
            if let Err(e) = policy::check(spec, &params, &honoured) {
                log::warn!("{}", e.message);
                return Err(e);
            }
            ctx.registry.settings().check(spec, &params)?;
            ctx.registry.settings().set(spec, params.clone());
            ctx.registry.settings().apply(spec, &params);
            log::info!("{}: accepted (kept for framework_get_config/save_config)", spec.method);
            Ok(json!(true))
        });
    }
    reg.method_in("framework_get_scheduler", STARTUP | RUNTIME, |ctx, p| async move {
        if p.0.is_some() {
            return Err(RpcError::new(INVALID_PARAMS, "'rpc_get_scheduler' requires no arguments"));
        }
        let period = ctx.registry.settings().get("framework_set_scheduler", None).and_then(|v| v["period"].as_u64());
        Ok(json!({"scheduler_name": "static", "scheduler_period": period.unwrap_or(0),
            "isolated_core_mask": "", "scheduling_core": 0}))
    });
}

/// Decodes params like the SPDK method does, with its error code.
fn decode(spec: &Spec, p: Params) -> Result<Value, RpcError> {
    let fail = |why: String| RpcError::new(spec.decode_error, format!("Invalid parameters: {why}"));
    let params = match p.0 {
        Some(v) => v,
        None if spec.params_optional => json!({}),
        None => return Err(fail("parameters required".into())),
    };
    let fields = schema::params_of(spec.method).ok_or_else(|| fail("no schema".into()))?;
    if spec.method == "framework_set_scheduler" {
        // SPDK decodes {name, period} strictly, then relaxed: extra members are the chosen
        // scheduler's own options, which the static scheduler has none of (EINVAL, -32603).
        let base: serde_json::Map<String, Value> = fields
            .iter()
            .filter(|(k, _)| *k == "name" || *k == "period")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        schema::check_object(&params, &base, true).map_err(fail)?;
        if schema::check_object(&params, &base, false).is_err() {
            return Err(RpcError::new(INTERNAL_ERROR, "Invalid argument: the static scheduler takes no options"));
        }
        return Ok(params);
    }
    schema::check_object(&params, fields, false).map_err(fail)?;
    Ok(params)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spec_has_a_schema_and_a_subsystem() {
        for s in SPECS {
            assert!(schema::params_of(s.method).is_some(), "{} has no schema", s.method);
            assert!(
                LEADING_SUBSYSTEMS.contains(&s.subsystem)
                    || TRAILING_SUBSYSTEMS.contains(&s.subsystem)
                    || s.subsystem == "bdev",
                "{}",
                s.method
            );
        }
    }

    #[test]
    fn scheduler_decoding_follows_spdk() {
        let spec = SPECS.iter().find(|s| s.method == "framework_set_scheduler").unwrap();
        assert!(decode(spec, Params(Some(json!({"name": "static", "period": 5})))).is_ok());
        assert_eq!(decode(spec, Params(Some(json!({"name": 5})))).unwrap_err().code, INVALID_PARAMS);
        assert_eq!(decode(spec, Params(Some(json!({"name": "static", "x": 1})))).unwrap_err().code, INTERNAL_ERROR);
        assert_eq!(decode(spec, Params(None)).unwrap_err().code, INVALID_PARAMS);
    }
}
