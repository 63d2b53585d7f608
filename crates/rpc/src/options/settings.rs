//! What the option methods have set: per method (and instance key), the union of the members
//! given so far (a later call overrides members, as SPDK's `*_set_options` start from the current
//! options).

use super::specs::{Spec, SPECS};
use serde_json::{json, Map, Value};
use std::sync::Mutex;

/// What one method (for one instance key) has set.
type Entry = (&'static str, Option<String>, Map<String, Value>);

/// Options set so far.
#[derive(Default)]
pub struct Settings {
    /// (method, instance key, members), in first-set order.
    entries: Mutex<Vec<Entry>>,
}

impl Settings {
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
