//! What defines an option method: its [`Spec`] (subsystem, RPC states, decode-error code, what
//! makes two calls set the same thing), SPDK's schema fragment and defaults, the members Ferrite
//! acts on, and what acting on them does ([`OptionMethod`]). The crate that owns the options
//! defines it and registers it with [`crate::Registry::option_method`].

use super::policy;
use super::schema::Schema;
use crate::RpcError;
use serde_json::Value;

/// A further check of an option method's params.
pub type Check = fn(&Value) -> Result<(), RpcError>;

/// How an option method is called.
#[derive(Clone, Copy)]
pub struct Spec {
    /// SPDK's method name.
    pub method: &'static str,
    /// The subsystem whose config lists it.
    pub subsystem: &'static str,
    /// RPC states it may be called in (SPDK's state mask).
    pub states: u8,
    /// Error code when params do not decode (what SPDK's handler answers: most -32602, some
    /// -32603 or even -32700).
    pub decode_error: i32,
    /// SPDK's handler accepts a call without params.
    pub params_optional: bool,
    /// Member naming the instance the options belong to (calls with different values are kept
    /// apart, e.g. one socket implementation each), if any.
    pub key: Option<&'static str>,
    /// Further checks of a call's params (what Ferrite can honour), before the policy's.
    pub check: Option<Check>,
}

impl Spec {
    /// A spec without instance key or further check.
    pub const fn new(
        method: &'static str,
        subsystem: &'static str,
        states: u8,
        decode_error: i32,
        params_optional: bool,
    ) -> Spec {
        Spec { method, subsystem, states, decode_error, params_optional, key: None, check: None }
    }
}

/// One option method, as the crate that owns its options defines it.
pub struct OptionMethod {
    /// How it is called.
    pub spec: Spec,
    /// SPDK v26.05's schema fragment (JSON, `schema/schema.json`'s layout) with an entry for
    /// the method and the classes it names.
    pub schema: &'static str,
    /// SPDK's defaults (JSON: `{"defaults": {method: {member: value}}}`, by key value for a
    /// method with an instance key), as `spdk_tgt`'s `save_config` writes them.
    pub defaults: &'static str,
    /// Members Ferrite acts on: any valid value is taken (see [`policy`]).
    pub honoured: &'static [&'static str],
    /// Members that tune SPDK machinery without a counterpart here, whose value changes nothing
    /// observable: any valid value is taken and kept; `*` for every member.
    pub inert: &'static [&'static str],
    /// A check of what the options would be after a call (what was set before, with the call's
    /// members over it), before they are kept.
    pub guard: Option<Check>,
    /// Acts on what the method has set (all its members so far, merged), after each accepted
    /// call.
    pub apply: Option<fn(&Value)>,
    /// The owner writes the method's config entry itself, first in its subsystem's entries (as
    /// SPDK writes `iscsi_set_options`: every member, with what runtime methods changed since),
    /// so the registry does not write what the calls set.
    pub owner_saves: bool,
}

impl OptionMethod {
    /// A method none of whose members is honoured or inert, without guard or action.
    pub const fn new(spec: Spec, schema: &'static str, defaults: &'static str) -> OptionMethod {
        OptionMethod { spec, schema, defaults, honoured: &[], inert: &[], guard: None, apply: None, owner_saves: false }
    }

    /// Checks the definition as registration would take it: the schema fragment and defaults
    /// parse and have the method, each honoured and inert member is one of its parameters, each
    /// honoured member has SPDK's default, and each of SPDK's default calls passes the schema
    /// and the policy.
    pub fn validate(&'static self) -> Result<(), String> {
        let d = Defined::parse(self)?;
        let name = self.spec.method;
        let params = d.schema.params();
        for m in self.honoured.iter().chain(self.inert.iter().filter(|m| **m != "*")) {
            if !params.contains_key(*m) {
                return Err(format!("{name}: {m} is honoured or inert but not a parameter in SPDK's schema"));
            }
        }
        let calls = d.default_calls();
        if calls.is_empty() {
            return Err(format!("{name}: no SPDK defaults"));
        }
        if let Some(m) = self.honoured.iter().find(|m| calls.iter().any(|c| c.get(**m).is_none())) {
            return Err(format!("{name}: honoured member {m} has no SPDK default"));
        }
        for call in calls {
            d.schema.check(&call, false).map_err(|e| format!("{name}: SPDK's defaults {call}: {e}"))?;
            policy::check(&d, &call).map_err(|e| format!("{name}: SPDK's defaults {call}: {}", e.message))?;
        }
        Ok(())
    }
}

impl OptionMethod {
    /// Checks a call with `params` as the registered method does before its guard: decoded by
    /// SPDK's schema (with the spec's decode-error code), the spec's check, then the policy
    /// (honoured, inert, or SPDK's default). For an owner's tests; parses the definition anew.
    pub fn check_call(&'static self, params: Option<Value>) -> Result<Value, RpcError> {
        let d = Defined::parse(self).map_err(|e| RpcError::new(crate::jsonrpc::INTERNAL_ERROR, e))?;
        super::checked(&d, crate::Params(params))
    }
}

/// An option method as registered: its definition, with its schema and defaults parsed.
pub struct Defined {
    /// The definition.
    pub def: &'static OptionMethod,
    /// Its parameters' schema.
    pub schema: Schema,
    /// SPDK's defaults of its members (by key value for a method with an instance key).
    pub defaults: Value,
}

impl Defined {
    /// Parses `def`'s schema and defaults.
    pub fn parse(def: &'static OptionMethod) -> Result<Defined, String> {
        let method = def.spec.method;
        let schema = Schema::parse(def.schema, method)?;
        let all: Value = serde_json::from_str(def.defaults).map_err(|e| format!("defaults of {method}: {e}"))?;
        let defaults = all["defaults"][method].clone();
        if !defaults.is_object() {
            return Err(format!("the defaults have no entry for {method}"));
        }
        Ok(Defined { def, schema, defaults })
    }

    /// The spec.
    pub fn spec(&self) -> &'static Spec {
        &self.def.spec
    }

    /// SPDK's default of member `field` (for instance `key` where the method has one).
    pub fn default_of(&self, key: Option<&str>, field: &str) -> Option<&Value> {
        let d = match key {
            Some(k) => &self.defaults[k][field],
            None => &self.defaults[field],
        };
        (!d.is_null()).then_some(d)
    }

    /// The calls SPDK's `save_config` writes with the defaults (one per instance key value).
    fn default_calls(&self) -> Vec<Value> {
        match self.def.spec.key {
            Some(_) => self.defaults.as_object().map(|m| m.values().cloned().collect()).unwrap_or_default(),
            None => vec![self.defaults.clone()],
        }
    }
}
