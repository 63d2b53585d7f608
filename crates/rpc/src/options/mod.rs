//! SPDK's option methods (`*_set_options`, `nvmf_set_config`, `framework_set_scheduler`, ...) as
//! real RPCs: SPDK's parameter schemas, RPC states and decode-error codes; what a call sets is
//! kept ([`Settings`]) and written back by `framework_get_config`/`save_config` in its
//! subsystem, in SPDK's order ([`SPDK_ORDER`]), so a config round-trips without loss.
//!
//! Each option method is defined by the crate that owns its options ([`OptionMethod`]: how it
//! is called, SPDK's schema fragment and defaults, the members it acts on and what acting on
//! them does) and registered with [`Registry::option_method`]; this module is the machinery
//! (decoding, [`policy`], settings, order) and defines the framework's own methods
//! (scheduler, sock, iobuf, keyring, fsdev, accel) and, until its module exists, RAID's
//! ([`absent`]).
//!
//! Each member is honoured (its crate acts on it and says so), inert (it tunes SPDK machinery
//! without a counterpart here, and any value changes nothing observable), or held to SPDK's
//! default: another value is refused by name ([`policy`]), so that a saved SPDK config loads
//! unchanged and no call makes its caller believe in a behaviour Ferrite does not have. The
//! scheduler must be `static` (threads never move between reactors), socket implementations
//! must be ones SPDK knows, and `iobuf_set_options` sizes the reactors' buffer pools when the
//! framework starts ([`iobuf`]).

pub mod absent;
pub mod framework;
pub mod iobuf;
mod order;
pub mod policy;
mod schema;
mod settings;
mod spec;

pub use order::SPDK_ORDER;
pub use settings::Settings;
pub use spec::{Check, OptionMethod, Spec};

use crate::jsonrpc::{RpcError, INTERNAL_ERROR, INVALID_PARAMS};
use crate::registry::{MethodDoc, Params, ParamsDoc, Registry, RUNTIME, STARTUP};
use serde_json::{json, Value};
use spec::Defined;
use std::sync::Arc;

/// Subsystems that exist here only to hold options (listed like SPDK's, in SPDK's order, around
/// the ones Ferrite's modules register).
pub const LEADING_SUBSYSTEMS: &[&str] = &["scheduler", "vmd", "sock", "iobuf", "keyring", "fsdev", "accel"];
/// Option-only subsystems listed after the modules' ones.
pub const TRAILING_SUBSYSTEMS: &[&str] = &["nvmf", "iscsi"];

/// Registers the framework's option methods, those of absent modules, `framework_get_scheduler`
/// and `vmd_enable`.
pub fn register(reg: &mut Registry) {
    for m in framework::METHODS.iter().chain(&absent::METHODS) {
        reg.option_method(m);
    }
    reg.bare_with(
        "framework_get_scheduler",
        STARTUP | RUNTIME,
        "The scheduler (always `static`) and the period `framework_set_scheduler` set.",
        no_arguments,
        |ctx| async move {
            let period =
                ctx.registry.settings().get("framework_set_scheduler", None).and_then(|v| v["period"].as_u64());
            Ok(json!({"scheduler_name": "static", "scheduler_period": period.unwrap_or(0),
            "isolated_core_mask": "", "scheduling_core": 0}))
        },
    );
}

/// SPDK's answer to params given to `framework_get_scheduler`.
fn no_arguments(_: &'static str, p: Params) -> Result<(), RpcError> {
    match p.0 {
        Some(_) => Err(RpcError::new(INVALID_PARAMS, "'rpc_get_scheduler' requires no arguments")),
        None => Ok(()),
    }
}

/// Adds `def`'s method to `reg` (see [`Registry::option_method`]).
pub(crate) fn add(reg: &mut Registry, def: &'static OptionMethod) {
    let m = Arc::new(Defined::parse(def).unwrap_or_else(|e| panic!("option method {}: {e}", def.spec.method)));
    reg.settings_mut().add(m.clone());
    let doc = MethodDoc {
        summary: summary(def).into(),
        params: ParamsDoc::Rows(rows(&m)),
        params_required: !def.spec.params_optional,
    };
    reg.raw(def.spec.method, def.spec.states, doc, move |ctx, p: Params| {
        let m = m.clone();
        async move { set(&ctx.registry, &m, p) }
    });
}

/// The summary of option method `def`.
fn summary(def: &OptionMethod) -> String {
    let required = if def.spec.params_optional { "" } else { "; params are required" };
    format!(
        "Sets options of the `{}` subsystem, as SPDK's method (SPDK's schema and defaults; what a call sets \
         is kept for `save_config`{required}).",
        def.spec.subsystem
    )
}

/// The parameter rows of option method `m`: SPDK's schema, its defaults, and what each member
/// does here ([`policy`]).
fn rows(m: &Defined) -> Vec<crate::reference::ParamRow> {
    let def = m.def;
    let inert = |f: &str| def.inert.iter().any(|i| *i == "*" || *i == f);
    let key = def.spec.key;
    m.schema
        .params()
        .iter()
        .map(|(name, field)| {
            let default = match key {
                None => m.default_of(None, name).cloned(),
                Some(_) => None,
            };
            let description = if Some(name.as_str()) == key {
                "Which instance the options are for (calls for different ones are kept apart)."
            } else if def.honoured.contains(&name.as_str()) {
                "Honoured: Ferrite acts on it."
            } else if inert(name) {
                "Inert: tunes SPDK machinery Ferrite does not have; any valid value is taken and kept."
            } else {
                "Only SPDK's default is accepted (Ferrite has no such behaviour)."
            };
            let example_given = default.is_some();
            let example = default.clone().unwrap_or_else(|| m.schema.example(field));
            crate::reference::ParamRow {
                name: name.clone(),
                ty: m.schema.type_text(field),
                required: field["required"] == true,
                default,
                description: description.into(),
                example,
                example_given,
            }
        })
        .collect()
}

/// A call of option method `m`: decoded, checked, kept, then acted on.
fn set(reg: &Registry, m: &Defined, p: Params) -> Result<Value, RpcError> {
    let spec = m.spec();
    let params = checked(m, p)?;
    reg.settings().check(m, &params)?;
    reg.settings().set(m, params.clone());
    reg.settings().apply(m, &params);
    log::info!("{}: accepted (kept for framework_get_config/save_config)", spec.method);
    Ok(json!(true))
}

/// The params of a call of `m`, decoded and checked by the spec's check and the policy (what
/// comes before the guard, which needs what was set before).
fn checked(m: &Defined, p: Params) -> Result<Value, RpcError> {
    let params = decode(m, p)?;
    if let Some(check) = m.spec().check {
        check(&params)?;
    }
    if let Err(e) = policy::check(m, &params) {
        log::warn!("{}", e.message);
        return Err(e);
    }
    Ok(params)
}

/// Decodes params like the SPDK method does, with its error code.
fn decode(m: &Defined, p: Params) -> Result<Value, RpcError> {
    let spec = m.spec();
    let fail = |why: String| RpcError::new(spec.decode_error, format!("Invalid parameters: {why}"));
    let params = match p.0 {
        Some(v) => v,
        None if spec.params_optional => json!({}),
        None => return Err(fail("parameters required".into())),
    };
    if spec.method == "framework_set_scheduler" {
        // SPDK decodes {name, period} strictly, then relaxed: extra members are the chosen
        // scheduler's own options, which the static scheduler has none of (EINVAL, -32603).
        let base: serde_json::Map<String, Value> = m
            .schema
            .params()
            .iter()
            .filter(|(k, _)| *k == "name" || *k == "period")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        m.schema.check_object(&params, &base, true).map_err(fail)?;
        if m.schema.check_object(&params, &base, false).is_err() {
            return Err(RpcError::new(INTERNAL_ERROR, "Invalid argument: the static scheduler takes no options"));
        }
        return Ok(params);
    }
    m.schema.check(&params, false).map_err(fail)?;
    Ok(params)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defined(name: &str) -> Defined {
        let def = framework::METHODS.iter().chain(&absent::METHODS).find(|m| m.spec.method == name).unwrap();
        Defined::parse(def).unwrap()
    }

    #[test]
    fn the_framework_and_absent_methods_are_valid_and_have_a_subsystem() {
        for m in framework::METHODS.iter().chain(&absent::METHODS) {
            m.validate().unwrap_or_else(|e| panic!("{e}"));
            let s = m.spec.subsystem;
            assert!(
                LEADING_SUBSYSTEMS.contains(&s) || TRAILING_SUBSYSTEMS.contains(&s) || s == "bdev",
                "{}",
                m.spec.method
            );
        }
    }

    #[test]
    fn save_config_lists_them_in_spdks_order_whatever_the_calls_order() {
        let reg = crate::app::registry(|_| {});
        let names: Vec<&str> = reg.settings().methods().iter().map(|m| m.spec.method).collect();
        assert_eq!(names.len(), framework::METHODS.len() + absent::METHODS.len());
        let call = |name: &str, p: Value| set(&reg, &reg.settings().defined(name).unwrap(), Params(Some(p))).unwrap();
        call("sock_impl_set_options", json!({"impl_name": "ssl"}));
        call("sock_set_default_impl", json!({"impl_name": "posix"}));
        call("sock_impl_set_options", json!({"impl_name": "posix", "recv_buf_size": 4096}));
        call("sock_impl_set_options", json!({"impl_name": "ssl", "send_buf_size": 8192}));
        let methods =
            |s: &str| -> Vec<Value> { reg.settings().entries(s).iter().map(|e| e["method"].clone()).collect() };
        assert!(methods("bdev").is_empty(), "the bdev modules own theirs");
        let sock = reg.settings().entries("sock");
        assert_eq!(sock[0], json!({"method": "sock_set_default_impl", "params": {"impl_name": "posix"}}));
        assert_eq!(sock[1]["params"], json!({"impl_name": "ssl", "send_buf_size": 8192}), "kept per impl, merged");
        assert_eq!(sock[2]["params"], json!({"impl_name": "posix", "recv_buf_size": 4096}));
        assert_eq!(sock.len(), 3);
    }

    #[test]
    fn a_method_its_owner_saves_is_kept_but_not_written_by_the_registry() {
        static M: OptionMethod = OptionMethod {
            owner_saves: true,
            ..OptionMethod::new(
                Spec::new("iscsi_set_options", "iscsi", STARTUP, INVALID_PARAMS, true),
                r#"{"methods": {"iscsi_set_options": {"max_sessions": {"type": "uint32"}}}}"#,
                r#"{"defaults": {"iscsi_set_options": {"max_sessions": 128}}}"#,
            )
        };
        let mut reg = Registry::default();
        reg.option_method(&M);
        let m = reg.settings().defined("iscsi_set_options").unwrap();
        set(&reg, &m, Params(Some(json!({"max_sessions": 128})))).unwrap();
        assert_eq!(reg.settings().get("iscsi_set_options", None), Some(json!({"max_sessions": 128})));
        assert!(reg.settings().entries("iscsi").is_empty(), "the owner writes it");
    }

    #[test]
    #[should_panic(expected = "no place in SPDK_ORDER")]
    fn a_method_without_a_place_in_the_order_is_refused() {
        static M: OptionMethod = OptionMethod::new(
            Spec::new("frob_set_options", "bdev", STARTUP, INVALID_PARAMS, true),
            r#"{"methods": {"frob_set_options": {}}}"#,
            r#"{"defaults": {"frob_set_options": {}}}"#,
        );
        Registry::default().option_method(&M);
    }

    #[test]
    fn scheduler_decoding_follows_spdk() {
        let m = defined("framework_set_scheduler");
        assert!(decode(&m, Params(Some(json!({"name": "static", "period": 5})))).is_ok());
        assert_eq!(decode(&m, Params(Some(json!({"name": 5})))).unwrap_err().code, INVALID_PARAMS);
        assert_eq!(decode(&m, Params(Some(json!({"name": "static", "x": 1})))).unwrap_err().code, INTERNAL_ERROR);
        assert_eq!(decode(&m, Params(None)).unwrap_err().code, INVALID_PARAMS);
    }
}
