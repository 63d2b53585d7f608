//! Parameter checking against SPDK's own machine-readable RPC schema (`schema/schema.json` of
//! SPDK v26.05), with the rules of SPDK's JSON decoders: unknown members and wrong types are
//! refused, integers must fit their type exactly, enums are matched exactly.
//!
//! Each crate that owns an option method embeds the fragment of that file its methods need: the
//! same layout (`methods`, and the `enums`, `objects` and `arrays` they name), so that a
//! fragment can be compared with SPDK's file entry by entry.

use serde_json::{Map, Value};

/// The schema of one method: its parameter table and the classes (enums, objects, arrays) of
/// the fragment it came from.
#[derive(Debug)]
pub struct Schema {
    /// Name → {type, class?, required?}.
    params: Map<String, Value>,
    /// The whole fragment, for the classes the parameters name.
    classes: Value,
}

impl Schema {
    /// The schema of `method` in the fragment `json`. Fails if the fragment is not JSON, lacks
    /// the method, or a parameter has a type this checker does not know or names a class the
    /// fragment does not hold.
    pub fn parse(json: &str, method: &str) -> Result<Schema, String> {
        let classes: Value = serde_json::from_str(json).map_err(|e| format!("schema of {method}: {e}"))?;
        let params = classes["methods"][method]
            .as_object()
            .cloned()
            .ok_or_else(|| format!("the schema fragment has no entry for {method}"))?;
        let s = Schema { params, classes };
        s.check_table(&s.params).map_err(|e| format!("schema of {method}: {e}"))?;
        Ok(s)
    }

    /// The parameter table (name → {type, class?, required?}).
    pub fn params(&self) -> &Map<String, Value> {
        &self.params
    }

    /// A readable type of parameter entry `field` ({type, class?}), e.g. `uint32`,
    /// `"posix" | "ssl"`, `array of "crc32c" | "none"`, `object {policy}`.
    pub fn type_text(&self, field: &Value) -> String {
        let class = field["class"].as_str().unwrap_or("");
        let enum_text = |class: &str| {
            let names = self.classes["enums"][class].as_array().cloned().unwrap_or_default();
            names.iter().map(Value::to_string).collect::<Vec<_>>().join(" | ")
        };
        match field["type"].as_str().unwrap_or("") {
            "enum" => enum_text(class),
            "array" => format!("array of {}", enum_text(self.classes["arrays"][class]["class"].as_str().unwrap_or(""))),
            "object" => {
                let names: Vec<&str> =
                    self.classes["objects"][class].as_object().into_iter().flatten().map(|(k, _)| k.as_str()).collect();
                format!("object {{{}}}", names.join(", "))
            }
            t => t.to_string(),
        }
    }

    /// An example value of parameter entry `field`: the first of an enum, else by type.
    pub fn example(&self, field: &Value) -> Value {
        let class = field["class"].as_str().unwrap_or("");
        match field["type"].as_str().unwrap_or("") {
            "enum" => self.classes["enums"][class][0].clone(),
            "boolean" => Value::Bool(true),
            "string" => Value::String("<value>".into()),
            "array" | "object" => Value::Null,
            _ => Value::from(1),
        }
    }

    /// Checks `params` against the method's table; `relaxed` ignores unknown members (SPDK's
    /// spdk_json_decode_object_relaxed). Returns what is wrong.
    pub fn check(&self, params: &Value, relaxed: bool) -> Result<(), String> {
        self.check_object(params, &self.params, relaxed)
    }

    /// Checks `params` (an object) against the table `fields` (the method's or a part of it).
    pub fn check_object(&self, params: &Value, fields: &Map<String, Value>, relaxed: bool) -> Result<(), String> {
        let obj = params.as_object().ok_or("params must be an object")?;
        for (k, v) in obj {
            match fields.get(k) {
                Some(f) => self.check_value(v, f).map_err(|e| format!("{k}: {e}"))?,
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

    fn check_value(&self, v: &Value, field: &Value) -> Result<(), String> {
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
            "enum" => self.check_enum(v, class),
            "object" => {
                let fields =
                    self.classes["objects"][class].as_object().ok_or_else(|| format!("no object class {class}"))?;
                self.check_object(v, fields, false)
            }
            "array" => {
                let spec = &self.classes["arrays"][class];
                let items = v.as_array().ok_or_else(|| format!("expected an array, got {v}"))?;
                if let Some(max) = spec["max_count"].as_u64() {
                    if items.len() as u64 > max {
                        return Err(format!("at most {max} items"));
                    }
                }
                let item_class = spec["class"].as_str().unwrap_or("");
                items.iter().try_for_each(|i| self.check_enum(i, item_class))
            }
            other => Err(format!("unsupported schema type {other}")),
        }
    }

    fn check_enum(&self, v: &Value, class: &str) -> Result<(), String> {
        let names = self.classes["enums"][class].as_array().ok_or_else(|| format!("no enum {class}"))?;
        match v.as_str() {
            Some(s) if names.iter().any(|n| n == s) => Ok(()),
            _ => Err(format!("expected one of {}, got {v}", Value::Array(names.clone()))),
        }
    }

    /// Checks that every type of `fields` is known and every class it names is in the fragment.
    fn check_table(&self, fields: &Map<String, Value>) -> Result<(), String> {
        for (k, f) in fields {
            let class = f["class"].as_str().unwrap_or("");
            let known = match f["type"].as_str().unwrap_or("") {
                "uint8" | "uint16" | "uint32" | "uint64" | "int32" | "boolean" | "string" => true,
                "enum" => self.classes["enums"][class].is_array(),
                "object" => match self.classes["objects"][class].as_object() {
                    Some(inner) => self.check_table(inner).map(|_| true)?,
                    None => false,
                },
                "array" => {
                    let item = self.classes["arrays"][class]["class"].as_str().unwrap_or("");
                    self.classes["enums"][item].is_array()
                }
                _ => false,
            };
            if !known {
                return Err(format!("{k}: type {} of class {class:?} is not in the fragment", f["type"]));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A fragment with each kind of type (the shape of SPDK's bdev_nvme_set_options entry).
    const FRAGMENT: &str = r#"{
        "methods": {"m": {
            "action": {"type": "enum", "class": "action"},
            "timeout_us": {"type": "uint64"},
            "ack": {"type": "uint8"},
            "kato": {"type": "uint32"},
            "retries": {"type": "int32"},
            "digests": {"type": "array", "class": "digests"},
            "multipath": {"type": "object", "class": "multipath"}
        },
        "h": {"enable": {"type": "boolean", "required": true}, "period_us": {"type": "uint64"}}},
        "enums": {"action": ["none", "reset", "abort"], "digest": ["sha256", "sha384"],
                  "policy": ["active_passive", "active_active"]},
        "objects": {"multipath": {"policy": {"type": "enum", "class": "policy"}}},
        "arrays": {"digests": {"item_type": "enum", "class": "digest", "max_count": 32}}
    }"#;

    #[test]
    fn spdk_decoder_rules() {
        let f = Schema::parse(FRAGMENT, "m").unwrap();
        assert!(f.check(&json!({"timeout_us": 0, "action": "abort"}), false).is_ok());
        assert!(f.check(&json!({"ack": 256}), false).is_err());
        assert!(f.check(&json!({"kato": -1}), false).is_err());
        assert!(f.check(&json!({"kato": 1.5}), false).is_err());
        assert!(f.check(&json!({"retries": -1}), false).is_ok());
        assert!(f.check(&json!({"action": "explode"}), false).is_err());
        assert!(f.check(&json!({"digests": ["sha256", "md5"]}), false).is_err());
        assert!(f.check(&json!({"multipath": {"policy": "active_active", "x": 1}}), false).is_err());
        assert!(f.check(&json!({"frob": 1}), false).unwrap_err().contains("frob"));
        assert!(f.check(&json!({"frob": 1}), true).is_ok());
        assert!(f.check(&json!([1]), false).is_err());
        let h = Schema::parse(FRAGMENT, "h").unwrap();
        assert!(h.check(&json!({"period_us": 5}), false).unwrap_err().contains("enable"));
    }

    #[test]
    fn a_fragment_must_hold_the_method_and_the_classes_it_names() {
        assert!(Schema::parse(FRAGMENT, "other").unwrap_err().contains("other"));
        assert!(Schema::parse("{", "m").is_err());
        let missing = r#"{"methods": {"m": {"a": {"type": "enum", "class": "nope"}}}}"#;
        assert!(Schema::parse(missing, "m").unwrap_err().contains("nope"));
        let odd = r#"{"methods": {"m": {"a": {"type": "float"}}}}"#;
        assert!(Schema::parse(odd, "m").is_err());
    }
}
