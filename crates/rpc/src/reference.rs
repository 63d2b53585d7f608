//! The RPC reference (`docs/RPC.md`, `ferrite rpc --help METHOD`), made from the registry: each
//! method's summary, RPC states, parameters (from the schema of the type its handler decodes
//! into, or an option method's SPDK schema) and an example call built from them.

use crate::registry::{MethodDoc, ParamsDoc, Registry, RUNTIME, STARTUP};
use serde_json::{Map, Value};
use std::fmt::Write;

/// One parameter of a method.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamRow {
    /// Its name in the params object.
    pub name: String,
    /// Its type, e.g. `string`, `uint32`, `array of string`, `"read" | "write"`.
    pub ty: String,
    /// Whether a call must give it.
    pub required: bool,
    /// What it is when not given, if documented.
    pub default: Option<Value>,
    /// What it means.
    pub description: String,
    /// A value for the example call.
    pub example: Value,
    /// Whether that value is the schema's own (an example or the default), not a placeholder
    /// or a made-up value of its type.
    pub example_given: bool,
}

/// The parameters of a method as rows (None: it takes none).
pub fn rows(doc: &MethodDoc) -> Option<Vec<ParamRow>> {
    match &doc.params {
        ParamsDoc::None => None,
        ParamsDoc::Rows(r) => Some(r.clone()),
        ParamsDoc::Schema(f) => Some(schema_rows(f().as_value())),
    }
}

/// The rows of a root schema: the properties of its object (those of every alternative, for
/// params that decode into one of several shapes).
fn schema_rows(root: &Value) -> Vec<ParamRow> {
    let mut out: Vec<ParamRow> = Vec::new();
    collect(root, resolve(root, root), true, &mut out);
    // Required ones first, each part by name (schemars lists properties by name).
    out.sort_by_key(|r| !r.required);
    out
}

/// Adds the properties of object schema `s` to `out`; `all` is false inside an alternative (its
/// members are then required only by that alternative).
fn collect(root: &Value, s: &Value, all: bool, out: &mut Vec<ParamRow>) {
    let required: Vec<&str> =
        s["required"].as_array().map(|r| r.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
    if let Some(props) = s["properties"].as_object() {
        for (name, p) in props {
            if out.iter().any(|r| &r.name == name) {
                continue;
            }
            let t = resolve(root, p);
            let description = text_of(p).or_else(|| text_of(t)).unwrap_or_default();
            let default = p.get("default").or_else(|| t.get("default")).filter(|d| !d.is_null()).cloned();
            let example = example_of(root, p, name);
            let example_given = [p, t].iter().any(|x| {
                x["examples"].as_array().is_some_and(|e| !e.is_empty())
                    || x.get("default").is_some_and(|d| !d.is_null())
            });
            out.push(ParamRow {
                name: name.clone(),
                ty: type_of(root, p),
                required: all && required.contains(&name.as_str()),
                default,
                description,
                example,
                example_given,
            });
        }
    }
    for key in ["allOf", "oneOf", "anyOf"] {
        for alt in s[key].as_array().into_iter().flatten() {
            collect(root, resolve(root, alt), all && key == "allOf", out);
        }
    }
}

/// A schema's description on one line.
fn text_of(s: &Value) -> Option<String> {
    let d = s["description"].as_str()?;
    Some(d.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// Follows `$ref` (to the root's `$defs`), and `anyOf`/`oneOf` of one type and null (an
/// `Option`).
fn resolve<'a>(root: &'a Value, s: &'a Value) -> &'a Value {
    if let Some(r) = s["$ref"].as_str() {
        if let Some(name) = r.strip_prefix("#/$defs/") {
            return resolve(root, &root["$defs"][name]);
        }
        if r == "#" {
            return root;
        }
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(alts) = s[key].as_array() {
            let some: Vec<&Value> = alts.iter().filter(|a| a["type"] != "null").collect();
            if some.len() == 1 && alts.len() == 2 {
                return resolve(root, some[0]);
            }
        }
    }
    s
}

/// The constant values of an enum schema, if it is one.
fn enum_values(s: &Value) -> Option<Vec<Value>> {
    if let Some(e) = s["enum"].as_array() {
        return Some(e.iter().filter(|v| !v.is_null()).cloned().collect());
    }
    let alts = s["oneOf"].as_array().or_else(|| s["anyOf"].as_array())?;
    let mut out = Vec::new();
    for a in alts {
        if let Some(c) = a.get("const") {
            out.push(c.clone());
        } else if let Some(e) = a["enum"].as_array() {
            out.extend(e.iter().cloned());
        } else if a["type"] != "null" {
            return None;
        }
    }
    Some(out)
}

/// A readable type of schema `s`.
fn type_of(root: &Value, s: &Value) -> String {
    let t = resolve(root, s);
    if let Some(vals) = enum_values(t) {
        return vals.iter().map(Value::to_string).collect::<Vec<_>>().join(" \\| ");
    }
    let ty = match &t["type"] {
        Value::String(s) => s.clone(),
        Value::Array(a) => a.iter().filter_map(Value::as_str).filter(|s| *s != "null").collect::<Vec<_>>().join(" or "),
        _ => String::new(),
    };
    match ty.as_str() {
        "integer" => t["format"].as_str().unwrap_or("integer").to_string(),
        "array" => match t.get("items") {
            Some(items) => format!("array of {}", type_of(root, items)),
            None => "array".into(),
        },
        "object" if t.get("properties").is_some() => {
            let names: Vec<&str> = t["properties"].as_object().into_iter().flatten().map(|(k, _)| k.as_str()).collect();
            format!("object {{{}}}", names.join(", "))
        }
        "" => {
            let alts = t["oneOf"].as_array().or_else(|| t["anyOf"].as_array());
            match alts {
                Some(a) => {
                    a.iter().filter(|a| a["type"] != "null").map(|a| type_of(root, a)).collect::<Vec<_>>().join(" or ")
                }
                None => "any".into(),
            }
        }
        _ => ty,
    }
}

/// A value of schema `s` (named `name`) for an example call: its first example, its default,
/// its first enum value, or a placeholder of its type.
fn example_of(root: &Value, s: &Value, name: &str) -> Value {
    for sch in [s, resolve(root, s)] {
        if let Some(e) = sch["examples"].as_array().and_then(|e| e.first()) {
            return e.clone();
        }
        if let Some(d) = sch.get("default").filter(|d| !d.is_null()) {
            return d.clone();
        }
    }
    let t = resolve(root, s);
    if let Some(v) = enum_values(t).and_then(|v| v.into_iter().next()) {
        return v;
    }
    let ty = match &t["type"] {
        Value::String(s) => s.as_str(),
        Value::Array(a) => a.iter().filter_map(Value::as_str).find(|s| *s != "null").unwrap_or(""),
        _ => "",
    };
    match ty {
        "integer" | "number" => Value::from(t["minimum"].as_u64().unwrap_or(0).max(1)),
        "boolean" => Value::Bool(true),
        "array" => Value::Array(vec![example_of(root, &t["items"], name)]),
        "object" => {
            let mut m = Map::new();
            for r in schema_rows_of(root, t).into_iter().filter(|r| r.required) {
                m.insert(r.name, r.example);
            }
            Value::Object(m)
        }
        _ => Value::String(placeholder(name)),
    }
}

/// The rows of a nested object schema.
fn schema_rows_of(root: &Value, s: &Value) -> Vec<ParamRow> {
    let mut out = Vec::new();
    collect(root, s, true, &mut out);
    out
}

/// A placeholder string for parameter `name`, e.g. `<bdev_name>`.
fn placeholder(name: &str) -> String {
    format!("<{name}>")
}

/// The example call of `method` with its required params (`{}` if it must have params but
/// none is required) and, when some optional ones have an example or a default in the schema, a
/// second call with those too.
pub fn example(method: &str, rows: Option<&[ParamRow]>, params_required: bool) -> String {
    let rows = rows.unwrap_or_default();
    let call = |all: bool| {
        let m: Map<String, Value> = rows
            .iter()
            .filter(|r| r.required || (all && r.example_given))
            .map(|r| (r.name.clone(), r.example.clone()))
            .collect();
        if m.is_empty() && !params_required {
            format!("ferrite rpc {method}")
        } else {
            format!("ferrite rpc {method} '{}'", Value::Object(m))
        }
    };
    if rows.iter().all(|r| r.required || !r.example_given) {
        call(false)
    } else {
        format!("{}\n# with optional parameters (their examples or defaults):\n{}", call(false), call(true))
    }
}

/// The RPC states as words.
fn states_text(states: u8) -> &'static str {
    match (states & STARTUP != 0, states & RUNTIME != 0) {
        (true, true) => "startup and runtime",
        (true, false) => "startup only (before `framework_start_init`)",
        _ => "runtime (after `framework_start_init`)",
    }
}

/// A table cell: one line, pipes escaped.
fn cell(s: &str) -> String {
    s.replace('\n', " ").replace('|', "\\|").replace("\\\\|", "\\|")
}

/// The section of `method` (Markdown, also read as plain text by `ferrite rpc --help`), or
/// None if no such method exists.
pub fn section(reg: &Registry, method: &str) -> Option<String> {
    let doc = reg.doc_of(method)?;
    let states = reg.states_of(method)?;
    let rows = rows(doc);
    let mut s = String::new();
    let _ = writeln!(s, "### {method}\n");
    if !doc.summary.is_empty() {
        let _ = writeln!(s, "{}\n", doc.summary);
    }
    let _ = writeln!(s, "States: {}.\n", states_text(states));
    match &rows {
        None => s.push_str("Parameters: none.\n\n"),
        Some(r) if r.is_empty() => s.push_str("Parameters: none (an empty object is taken).\n\n"),
        Some(r) => {
            s.push_str("| parameter | type | required | default | description |\n|---|---|---|---|---|\n");
            for p in r {
                let default = p.default.as_ref().map(|d| format!("`{d}`")).unwrap_or_default();
                let _ = writeln!(
                    s,
                    "| `{}` | {} | {} | {} | {} |",
                    p.name,
                    cell(&p.ty),
                    if p.required { "yes" } else { "no" },
                    cell(&default),
                    cell(&p.description)
                );
            }
            s.push('\n');
        }
    }
    let _ = writeln!(s, "Example:\n\n```sh\n{}\n```\n", example(method, rows.as_deref(), doc.params_required));
    Some(s)
}

/// The group a method is listed under: its first word, or for `bdev_X_*` methods of which
/// there are several, `bdev_X` (a bdev module's methods); the application's own methods
/// (`spdk_*`, `rpc_get_methods`, `save_config`) are the framework's.
pub fn group_of(names: &[&str], method: &str) -> String {
    let mut parts = method.split('_');
    let first = parts.next().unwrap_or(method);
    if matches!(first, "spdk" | "rpc" | "save") {
        return "framework".into();
    }
    if first == "bdev" {
        if let Some(second) = parts.next() {
            let prefix = format!("bdev_{second}_");
            const VERBS: &[&str] = &["get", "set", "enable", "reset", "wait", "examine"];
            if !VERBS.contains(&second) && names.iter().filter(|n| n.starts_with(&prefix)).count() > 1 {
                return format!("bdev_{second}");
            }
        }
    }
    first.to_string()
}

/// The whole reference: a table of contents by group, then each group's methods.
pub fn markdown(reg: &Registry) -> String {
    let names = reg.method_names();
    let mut groups: Vec<(String, Vec<&str>)> = Vec::new();
    for n in &names {
        let g = group_of(&names, n);
        match groups.iter_mut().find(|(k, _)| *k == g) {
            Some((_, v)) => v.push(n),
            None => groups.push((g, vec![n])),
        }
    }
    groups.sort_by(|a, b| a.0.cmp(&b.0));
    let mut s = String::from(
        "# JSON-RPC reference\n\n\
         Generated from the method registry and the parameter schemas the handlers decode with; do not\n\
         edit. Regenerate with `cargo run -p ferrite -- rpc --doc-markdown > docs/RPC.md`.\n\
         `ferrite rpc --help METHOD` prints one method's section without a daemon.\n\n\
         States: SPDK's RPC states; startup methods run before `framework_start_init` (with\n\
         `ferrite serve --wait-for-rpc`), runtime ones after it.\n\n## Contents\n\n",
    );
    for (g, ms) in &groups {
        let links: Vec<String> = ms.iter().map(|m| format!("[{m}](#{m})")).collect();
        let _ = writeln!(s, "- **{g}**: {}", links.join(", "));
    }
    for (g, ms) in &groups {
        let _ = writeln!(s, "\n## {g}\n");
        for m in ms {
            if let Some(sec) = section(reg, m) {
                s.push_str(&sec);
            }
        }
    }
    // Without its last newline: the printer adds one.
    while s.ends_with('\n') {
        s.pop();
    }
    s
}

/// Names longer than twice this get no suggestions (the longest method name is shorter).
const MAX_NAME_HINT: usize = 48;

/// Method names close to `name` (sharing a word with it, or within a small edit distance),
/// best first, at most 8.
pub fn close_names(reg: &Registry, name: &str) -> Vec<&'static str> {
    // No method name is near this long; the edit distance of a huge one would take seconds.
    if name.len() > 2 * MAX_NAME_HINT {
        return Vec::new();
    }
    let words: Vec<&str> = name.split('_').filter(|w| w.len() > 2).collect();
    let mut scored: Vec<(usize, &'static str)> = reg
        .method_names()
        .into_iter()
        .filter_map(|m| {
            let d = distance(name, m);
            let shared = m.split('_').filter(|w| words.contains(w)).count();
            (d <= 3 || shared > 0 || m.contains(name)).then(|| (d.saturating_sub(shared * 4), m))
        })
        .collect();
    scored.sort();
    scored.into_iter().take(8).map(|(_, m)| m).collect()
}

/// Levenshtein distance.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            cur.push((prev[j] + usize::from(ca != *cb)).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Params;
    use serde::Deserialize;
    use serde_json::json;

    #[derive(Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Args {
        /// The bdev's name.
        name: String,
        /// Block size in bytes.
        #[schemars(example = 512)]
        block_size: u32,
        /// How many.
        #[serde(default = "four")]
        count: u64,
        /// Optional.
        mode: Option<Mode>,
        /// Tags.
        tags: Vec<String>,
    }

    fn four() -> u64 {
        4
    }

    #[derive(Deserialize, schemars::JsonSchema)]
    #[serde(rename_all = "snake_case")]
    enum Mode {
        Read,
        Write,
    }

    fn reg() -> Registry {
        let mut reg = Registry::default();
        reg.typed("frob_create", "Makes a frob.", |_, _: Args| async { Ok(json!(true)) });
        reg.bare_in("frob_list", STARTUP | RUNTIME, "Lists frobs.", |_| async { Ok(json!([])) });
        reg
    }

    #[test]
    fn a_typed_methods_section_lists_its_decoded_params() {
        let reg = reg();
        let s = section(&reg, "frob_create").unwrap();
        assert!(s.contains("Makes a frob."), "{s}");
        let order: Vec<&str> =
            s.lines().filter_map(|l| l.strip_prefix("| `")).map(|l| &l[..l.find('`').unwrap()]).collect();
        assert_eq!(order, ["block_size", "name", "tags", "count", "mode"], "required first");
        assert!(s.contains("| `name` | string | yes |  | The bdev's name. |"), "{s}");
        assert!(s.contains("| `block_size` | uint32 | yes |"), "{s}");
        assert!(s.contains("| `count` | uint64 | no | `4` | How many. |"), "{s}");
        assert!(s.contains(r#"| `mode` | "read" \| "write" | no |"#), "{s}");
        assert!(s.contains("| `tags` | array of string | yes |"), "{s}");
        assert!(s.contains(r#"ferrite rpc frob_create '{"block_size":512,"name":"<name>","tags":["<tags>"]}'"#), "{s}");
        assert!(s.contains("runtime"), "{s}");
        let s = section(&reg, "frob_list").unwrap();
        assert!(s.contains("Parameters: none.") && s.contains("startup and runtime"), "{s}");
        assert!(section(&reg, "frob_delete").is_none());
    }

    #[test]
    fn typed_methods_decode_as_before() {
        let reg = std::sync::Arc::new(reg());
        let engine = ferrite_reactor::Engine::start(ferrite_reactor::EngineConfig {
            cores: vec![0],
            mode: ferrite_reactor::ReactorMode::Interrupt,
            ..Default::default()
        })
        .unwrap();
        let ctx = crate::Ctx { engine: engine.clone(), registry: reg.clone() };
        reg.set_state(RUNTIME);
        let call = |m: &'static str, p: Option<Value>| {
            let ctx = ctx.clone();
            engine.run_async(0, move || async move { Registry::call(&ctx, m, Params(p)).await }).wait().unwrap()
        };
        let e = call("frob_create", Some(json!({"name": "a"}))).unwrap_err();
        assert_eq!(e.message, "Invalid parameters: missing field `block_size`");
        let ok = call("frob_create", Some(json!({"name": "a", "block_size": 1, "tags": []})));
        assert_eq!(ok.unwrap(), json!(true));
        let e = call("frob_list", Some(json!({"x": 1}))).unwrap_err();
        assert_eq!(e.message, "Invalid parameters: this method takes none");
        assert_eq!(call("frob_list", None).unwrap(), json!([]));
        engine.stop();
    }

    #[test]
    fn groups_and_close_names() {
        let names = ["bdev_malloc_create", "bdev_malloc_delete", "bdev_get_bdevs", "bdev_get_iostat", "nbd_start"];
        assert_eq!(group_of(&names, "bdev_malloc_create"), "bdev_malloc");
        assert_eq!(group_of(&names, "bdev_get_bdevs"), "bdev");
        assert_eq!(group_of(&names, "nbd_start"), "nbd");
        assert_eq!(group_of(&names, "save_config"), "framework");
        let reg = reg();
        assert_eq!(close_names(&reg, "frob_creat"), vec!["frob_create", "frob_list"]);
        assert!(close_names(&reg, "zzz").is_empty());
    }
}
