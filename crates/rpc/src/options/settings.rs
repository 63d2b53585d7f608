//! What the option methods have set: per method (and instance key), the union of the members
//! given so far (a later call overrides members, as SPDK's `*_set_options` start from the current
//! options).

use super::specs::{Spec, SPECS};
use crate::RpcError;
use serde_json::{json, Map, Value};
use std::sync::Mutex;

/// What one method (for one instance key) has set.
type Entry = (&'static str, Option<String>, Map<String, Value>);

/// A module's check of what an option method would set: the options as they would be after
/// the call (what was set before, with the call's members over it). Runs before they are kept.
pub type Guard = Box<dyn Fn(&Value) -> Result<(), RpcError> + Send + Sync>;

/// Options set so far.
#[derive(Default)]
pub struct Settings {
    /// (method, instance key, members), in first-set order.
    entries: Mutex<Vec<Entry>>,
    /// Modules' checks, by method.
    guards: Mutex<Vec<(&'static str, Guard)>>,
    /// Members a crate of Ferrite acts on, by method (see `policy`).
    honoured: Mutex<Vec<(&'static str, &'static [&'static str])>>,
    /// What a crate does when a call has set its options, by method.
    appliers: Mutex<Vec<(&'static str, Applier)>>,
}

/// Applies what an option method has set (all its members so far, merged).
pub type Applier = Box<dyn Fn(&Value) + Send + Sync>;

impl Settings {
    /// Adds a check of what `method` would set (a module that uses those options, and knows
    /// when they may change).
    pub fn guard(&self, method: &'static str, g: Guard) {
        self.guards.lock().unwrap_or_else(|p| p.into_inner()).push((method, g));
    }

    /// Declares that Ferrite acts on `fields` of `method` (any valid value is taken; other
    /// members must keep SPDK's default: see `policy`).
    pub fn honour(&self, method: &'static str, fields: &'static [&'static str]) {
        self.honoured.lock().unwrap_or_else(|p| p.into_inner()).push((method, fields));
    }

    /// The members of `method` a crate said it acts on.
    pub fn honoured(&self, method: &str) -> Vec<&'static str> {
        let h = self.honoured.lock().unwrap_or_else(|p| p.into_inner());
        h.iter().filter(|(m, _)| *m == method).flat_map(|(_, f)| f.iter().copied()).collect()
    }

    /// Runs `f` with what `method` has set, merged, after each accepted call.
    pub fn on_set(&self, method: &'static str, f: Applier) {
        self.appliers.lock().unwrap_or_else(|p| p.into_inner()).push((method, f));
    }

    /// Runs the appliers of `spec`'s method (after a call was kept).
    pub fn apply(&self, spec: &Spec, params: &Value) {
        let key = spec.key.and_then(|k| params[k].as_str());
        let Some(now) = self.get(spec.method, key) else { return };
        let appliers = self.appliers.lock().unwrap_or_else(|p| p.into_inner());
        appliers.iter().filter(|(m, _)| *m == spec.method).for_each(|(_, f)| f(&now));
    }

    /// Runs the checks of `spec`'s method on what the call with `params` would leave set.
    pub fn check(&self, spec: &Spec, params: &Value) -> Result<(), RpcError> {
        let guards = self.guards.lock().unwrap_or_else(|p| p.into_inner());
        if !guards.iter().any(|(m, _)| *m == spec.method) {
            return Ok(());
        }
        let key = spec.key.and_then(|k| params[k].as_str());
        let mut merged = match self.get(spec.method, key) {
            Some(Value::Object(m)) => m,
            _ => Map::new(),
        };
        if let Value::Object(given) = params {
            merged.extend(given.clone());
        }
        let merged = Value::Object(merged);
        guards.iter().filter(|(m, _)| *m == spec.method).try_for_each(|(_, g)| g(&merged))
    }

    /// Merges `params` (an object) into what `spec` has set.
    pub fn set(&self, spec: &Spec, params: Value) {
        let key = spec.key.and_then(|k| params[k].as_str().map(str::to_string));
        let Value::Object(given) = params else { return };
        let mut e = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        match e.iter_mut().find(|(m, k, _)| *m == spec.method && *k == key) {
            Some((_, _, kept)) => kept.extend(given),
            None => e.push((spec.method, key, given)),
        }
    }

    /// What `method` (for instance `key`) has set.
    pub fn get(&self, method: &str, key: Option<&str>) -> Option<Value> {
        let e = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        e.iter().find(|(m, k, _)| *m == method && k.as_deref() == key).map(|(_, _, v)| Value::Object(v.clone()))
    }

    /// Config entries of `subsystem`, in [`SPECS`] order, then first-set order.
    pub fn entries(&self, subsystem: &str) -> Vec<Value> {
        let e = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        SPECS
            .iter()
            .filter(|s| s.subsystem == subsystem)
            .flat_map(|s| e.iter().filter(move |(m, _, _)| *m == s.method))
            .map(
                |(m, _, params)| {
                    if params.is_empty() {
                        json!({"method": m})
                    } else {
                        json!({"method": m, "params": params})
                    }
                },
            )
            .collect()
    }
}
