//! The registered option methods and what they have set: per method (and instance key), the
//! union of the members given so far (a later call overrides members, as SPDK's
//! `*_set_options` start from the current options).

use super::order::SPDK_ORDER;
use super::spec::{Defined, OptionMethod};
use crate::RpcError;
use serde_json::{json, Map, Value};
use std::sync::{Arc, Mutex};

/// What one method (for one instance key) has set.
type Entry = (&'static str, Option<String>, Map<String, Value>);

/// The option methods and the options set so far.
#[derive(Default)]
pub struct Settings {
    /// Registered option methods, in registration order.
    methods: Vec<Arc<Defined>>,
    /// (method, instance key, members), in first-set order.
    entries: Mutex<Vec<Entry>>,
}

impl Settings {
    /// Adds a registered method (once, and only one [`SPDK_ORDER`] lists).
    pub(crate) fn add(&mut self, m: Arc<Defined>) {
        let name = m.spec().method;
        assert!(SPDK_ORDER.contains(&name), "option method {name} has no place in SPDK_ORDER");
        assert!(!self.methods.iter().any(|d| d.spec().method == name), "option method {name} registered twice");
        self.methods.push(m);
    }

    /// The registered option methods, in registration order.
    pub fn methods(&self) -> Vec<&'static OptionMethod> {
        self.methods.iter().map(|d| d.def).collect()
    }

    /// The registered method `name`.
    #[cfg(test)]
    pub(crate) fn defined(&self, name: &str) -> Option<Arc<Defined>> {
        self.methods.iter().find(|d| d.spec().method == name).cloned()
    }

    /// Runs the definition's action with what its method has set (after a call was kept).
    pub(crate) fn apply(&self, m: &Defined, params: &Value) {
        let Some(apply) = m.def.apply else { return };
        let key = m.spec().key.and_then(|k| params[k].as_str());
        if let Some(now) = self.get(m.spec().method, key) {
            apply(&now);
        }
    }

    /// Runs the definition's guard on what the call with `params` would leave set.
    pub(crate) fn check(&self, m: &Defined, params: &Value) -> Result<(), RpcError> {
        let Some(guard) = m.def.guard else { return Ok(()) };
        let key = m.spec().key.and_then(|k| params[k].as_str());
        let mut merged = match self.get(m.spec().method, key) {
            Some(Value::Object(m)) => m,
            _ => Map::new(),
        };
        if let Value::Object(given) = params {
            merged.extend(given.clone());
        }
        guard(&Value::Object(merged))
    }

    /// Merges `params` (an object) into what `m`'s method has set.
    pub(crate) fn set(&self, m: &Defined, params: Value) {
        let method = m.spec().method;
        let key = m.spec().key.and_then(|k| params[k].as_str().map(str::to_string));
        let Value::Object(given) = params else { return };
        let mut e = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        match e.iter_mut().find(|(m, k, _)| *m == method && *k == key) {
            Some((_, _, kept)) => kept.extend(given),
            None => e.push((method, key, given)),
        }
    }

    /// What `method` (for instance `key`) has set.
    pub fn get(&self, method: &str, key: Option<&str>) -> Option<Value> {
        let e = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        e.iter().find(|(m, k, _)| *m == method && k.as_deref() == key).map(|(_, _, v)| Value::Object(v.clone()))
    }

    /// Config entries of `subsystem`, in [`SPDK_ORDER`], then first-set order (but for methods
    /// whose owner writes their entry itself: [`OptionMethod::owner_saves`]).
    pub fn entries(&self, subsystem: &str) -> Vec<Value> {
        let e = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        SPDK_ORDER
            .iter()
            .filter(|name| {
                self.methods
                    .iter()
                    .any(|d| d.spec().method == **name && d.spec().subsystem == subsystem && !d.def.owner_saves)
            })
            .flat_map(|name| e.iter().filter(move |(m, _, _)| m == name))
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
