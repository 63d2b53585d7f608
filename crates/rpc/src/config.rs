//! SPDK's JSON config format: `{"subsystems":[{"subsystem":"bdev","config":[{"method":..,"params":..}]}]}`.
//! Loading replays each entry as a method call, in SPDK's two phases (startup, then runtime);
//! saving asks each subsystem for the entries that recreate its state.

use crate::registry::{Ctx, Params, Registry, RUNTIME, STARTUP};
use serde_json::{json, Value};

/// Builds the config of every subsystem (the result of `save_config`).
pub fn save(registry: &Registry) -> Value {
    let subsystems: Vec<Value> = registry
        .subsystems()
        .iter()
        .map(|s| json!({"subsystem": s.name, "config": registry.subsystem_config(s)}))
        .collect();
    json!({ "subsystems": subsystems })
}

/// One config entry: where it is and what it calls.
struct Entry<'a> {
    subsystem: &'a str,
    index: usize,
    method: &'a str,
    params: Option<Value>,
}

/// Checks the document's shape and lists its entries, in order. A method Ferrite does not have
/// fails the load, unless its subsystem is one Ferrite does not have either (then it is skipped,
/// as SPDK's loader skips subsystems not linked into the application).
fn entries<'a>(registry: &Registry, doc: &'a Value) -> Result<Vec<Entry<'a>>, String> {
    let subsystems = doc
        .get("subsystems")
        .and_then(Value::as_array)
        .ok_or_else(|| "config has no \"subsystems\" array".to_string())?;
    let mut out = Vec::new();
    for sub in subsystems {
        let name = sub.get("subsystem").and_then(Value::as_str).ok_or("a subsystem entry has no \"subsystem\" name")?;
        let list = match sub.get("config") {
            None | Some(Value::Null) => continue,
            Some(Value::Array(a)) => a,
            Some(_) => return Err(format!("subsystem {name}: \"config\" is not an array")),
        };
        let known_subsystem = registry.subsystems().iter().any(|s| s.name == name);
        for (i, entry) in list.iter().enumerate() {
            let method = entry
                .get("method")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("subsystem {name}, entry {i}: no \"method\""))?;
            if registry.states_of(method).is_none() {
                if known_subsystem {
                    return Err(format!("subsystem {name}, entry {i}: {method}: Method not found"));
                }
                log::info!("skipping {method}: subsystem {name} does not exist in Ferrite");
                continue;
            }
            let params = entry.get("params").cloned().filter(|p| !p.is_null());
            out.push(Entry { subsystem: name, index: i, method, params });
        }
    }
    Ok(out)
}

/// Replays the entries allowed in the current state; with `skip_both`, not those allowed in
/// both states (they ran at startup already).
async fn replay(ctx: &Ctx, entries: &[Entry<'_>], skip_both: bool) -> Result<usize, String> {
    let mut applied = 0;
    for e in entries {
        let states = ctx.registry.states_of(e.method).unwrap_or(0);
        let now = ctx.registry.state();
        if states & now != now || (skip_both && states == STARTUP | RUNTIME) {
            continue;
        }
        Registry::call(ctx, e.method, Params(e.params.clone()))
            .await
            .map_err(|err| format!("subsystem {}, entry {}: {}: {}", e.subsystem, e.index, e.method, err.message))?;
        applied += 1;
    }
    Ok(applied)
}

/// Replays a config document on the calling reactor (the first one) as SPDK's loader does:
/// in the startup state the entries allowed then, then the framework starts (state runtime) and
/// the remaining entries follow. With `wait` (`--wait-for-rpc`) the framework does not start:
/// the runtime entries wait for `framework_start_init`. Stops at the first entry that fails,
/// with a message naming the subsystem, the entry and the method. Returns the entries applied.
pub async fn load(ctx: &Ctx, doc: &Value, wait: bool) -> Result<usize, String> {
    let list = entries(&ctx.registry, doc)?;
    let started_in_startup = ctx.registry.state() == STARTUP;
    let mut applied = replay(ctx, &list, false).await?;
    if started_in_startup {
        if wait {
            ctx.registry.defer_config(Some(doc.clone()));
        } else {
            start_framework(ctx).await?;
            applied += replay(ctx, &list, true).await?;
        }
    }
    Ok(applied)
}

/// Starts the framework (call on the first reactor): what SPDK's subsystems do at init that
/// Ferrite has to do (the buffer pools are made from `iobuf_set_options`), then the runtime
/// state. On failure the state stays startup.
pub async fn start_framework(ctx: &Ctx) -> Result<(), String> {
    crate::options::iobuf::apply(ctx).await?;
    ctx.registry.set_state(RUNTIME);
    Ok(())
}

/// `framework_start_init`: starts the framework and replays the runtime entries of a config
/// loaded with `wait`.
pub async fn start_init(ctx: &Ctx) -> Result<usize, String> {
    start_framework(ctx).await?;
    match ctx.registry.defer_config(None) {
        Some(doc) => {
            let list = entries(&ctx.registry, &doc)?;
            replay(ctx, &list, true).await
        }
        None => Ok(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Subsystem;
    use std::sync::{Arc, Mutex};

    fn ctx_with(reg: Registry) -> (ferrite_reactor::Engine, Ctx) {
        let engine = ferrite_reactor::Engine::start(ferrite_reactor::EngineConfig {
            cores: vec![0],
            mode: ferrite_reactor::ReactorMode::Interrupt,
            ..Default::default()
        })
        .unwrap();
        let ctx = Ctx { engine: engine.clone(), registry: Arc::new(reg) };
        (engine, ctx)
    }

    #[test]
    fn save_then_load_replays_the_same_entries() {
        let state = Arc::new(Mutex::new(Vec::<Value>::new()));
        let mut reg = Registry::default();
        let s = state.clone();
        let doc = crate::registry::MethodDoc {
            summary: "".into(),
            params: crate::registry::ParamsDoc::None,
            params_required: false,
        };
        reg.raw("thing_create", crate::registry::RUNTIME, doc, move |_, p: Params| {
            let s = s.clone();
            async move {
                s.lock().unwrap().push(p.0.unwrap_or(Value::Null));
                Ok(json!(true))
            }
        });
        let s = state.clone();
        reg.subsystem(Subsystem {
            name: "things",
            depends_on: vec![],
            config: Arc::new(move || {
                s.lock().unwrap().iter().map(|p| json!({"method": "thing_create", "params": p})).collect()
            }),
        });
        let (engine, ctx) = ctx_with(reg);
        let doc = json!({"subsystems": [
            {"subsystem": "things", "config": [
                {"method": "thing_create", "params": {"name": "a"}},
                {"method": "thing_create", "params": {"name": "b"}}]},
            {"subsystem": "absent", "config": [{"method": "absent_set_options", "params": {}}]},
            {"subsystem": "empty", "config": null}]});
        let c = ctx.clone();
        let n = engine.run_async(0, move || async move { load(&c, &doc, false).await }).wait().unwrap().unwrap();
        assert_eq!(n, 2);
        assert_eq!(ctx.registry.state(), RUNTIME);
        let saved = save(&ctx.registry);
        assert_eq!(
            saved,
            json!({"subsystems": [{"subsystem": "things", "config": [
                {"method": "thing_create", "params": {"name": "a"}},
                {"method": "thing_create", "params": {"name": "b"}}]}]})
        );
        // Replaying the saved config reproduces the same state.
        state.lock().unwrap().clear();
        let c = ctx.clone();
        engine.run_async(0, move || async move { load(&c, &saved, false).await }).wait().unwrap().unwrap();
        assert_eq!(save(&ctx.registry)["subsystems"][0]["config"].as_array().unwrap().len(), 2);
        engine.stop();
        engine.join();
    }

    #[test]
    fn unknown_methods_stop_the_load_and_are_named() {
        let mut reg = Registry::default();
        reg.subsystem(Subsystem { name: "bdev", depends_on: vec![], config: Arc::new(Vec::new) });
        let (engine, ctx) = ctx_with(reg);
        let doc = json!({"subsystems": [{"subsystem": "bdev", "config": [
            {"method": "iobuf_set_options", "params": {}}, {"method": "bdev_frobnicate", "params": {}}]}]});
        let err =
            engine.run_async(0, move || async move { load(&ctx, &doc, false).await }).wait().unwrap().unwrap_err();
        assert!(err.contains("iobuf_set_options") && err.contains("entry 0"), "{err}");
        engine.stop();
        engine.join();
    }

    #[test]
    fn malformed_documents_are_rejected() {
        let (engine, ctx) = ctx_with(Registry::default());
        for doc in [
            json!({}),
            json!({"subsystems": [{"config": []}]}),
            json!({"subsystems": [{"subsystem": "x", "config": 3}]}),
        ] {
            let c = ctx.clone();
            let res = engine.run_async(0, move || async move { load(&c, &doc, false).await }).wait().unwrap();
            assert!(res.is_err());
        }
        engine.stop();
        engine.join();
    }
}
