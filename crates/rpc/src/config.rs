//! SPDK's JSON config format: `{"subsystems":[{"subsystem":"bdev","config":[{"method":..,"params":..}]}]}`.
//! Loading replays each entry as a method call, in order; saving asks each subsystem for the
//! entries that recreate its state.

use crate::registry::{Ctx, Params, Registry};
use serde_json::{json, Value};

/// Builds the config of every subsystem (the result of `save_config`).
pub fn save(registry: &Registry) -> Value {
    let subsystems: Vec<Value> =
        registry.subsystems().iter().map(|s| json!({"subsystem": s.name, "config": (s.config)()})).collect();
    json!({ "subsystems": subsystems })
}

/// Replays a config document on the calling reactor (the first one). Stops at the first entry
/// that fails, with a message naming the subsystem, the entry and the method.
pub async fn load(ctx: &Ctx, doc: &Value) -> Result<usize, String> {
    let subsystems = doc
        .get("subsystems")
        .and_then(Value::as_array)
        .ok_or_else(|| "config has no \"subsystems\" array".to_string())?;
    let mut applied = 0;
    for sub in subsystems {
        let name = sub.get("subsystem").and_then(Value::as_str).ok_or("a subsystem entry has no \"subsystem\" name")?;
        let entries = match sub.get("config") {
            None | Some(Value::Null) => continue,
            Some(Value::Array(a)) => a,
            Some(_) => return Err(format!("subsystem {name}: \"config\" is not an array")),
        };
        for (i, entry) in entries.iter().enumerate() {
            let method = entry
                .get("method")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("subsystem {name}, entry {i}: no \"method\""))?;
            let params = entry.get("params").cloned().filter(|p| !p.is_null());
            Registry::call(ctx, method, Params(params))
                .await
                .map_err(|e| format!("subsystem {name}, entry {i}: {method}: {}", e.message))?;
            applied += 1;
        }
    }
    Ok(applied)
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
        reg.method("thing_create", move |_, p: Params| {
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
                {"method": "bdev_set_options", "params": {"bdev_io_pool_size": 65535}},
                {"method": "thing_create", "params": {"name": "a"}},
                {"method": "thing_create", "params": {"name": "b"}},
                {"method": "sock_set_default_impl", "params": {"impl_name": "posix"}}]},
            {"subsystem": "empty", "config": null}]});
        let c = ctx.clone();
        let n = engine.run_async(0, move || async move { load(&c, &doc).await }).wait().unwrap().unwrap();
        assert_eq!(n, 4);
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
        engine.run_async(0, move || async move { load(&c, &saved).await }).wait().unwrap().unwrap();
        assert_eq!(save(&ctx.registry)["subsystems"][0]["config"].as_array().unwrap().len(), 2);
        engine.stop();
        engine.join();
    }

    #[test]
    fn unknown_methods_stop_the_load_and_are_named() {
        let (engine, ctx) = ctx_with(Registry::default());
        let doc = json!({"subsystems": [{"subsystem": "bdev", "config": [
            {"method": "iobuf_set_options", "params": {}}, {"method": "bdev_frobnicate", "params": {}}]}]});
        let err = engine.run_async(0, move || async move { load(&ctx, &doc).await }).wait().unwrap().unwrap_err();
        assert!(err.contains("bdev_frobnicate") && err.contains("entry 1"), "{err}");
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
            let res = engine.run_async(0, move || async move { load(&c, &doc).await }).wait().unwrap();
            assert!(res.is_err());
        }
        engine.stop();
        engine.join();
    }
}
