//! Framework methods: version, method list, reactors, subsystems, config, and shutdown.

use crate::jsonrpc::{RpcError, INVALID_PARAMS};
use crate::registry::{Params, Registry};
use serde::Deserialize;
use serde_json::{json, Value};

/// Registers spdk_get_version, rpc_get_methods, framework_get_reactors, framework_get_subsystems,
/// framework_get_config, save_config and spdk_kill_instance.
pub fn register(reg: &mut Registry) {
    reg.method("spdk_get_version", |_, p| async move {
        p.none()?;
        let v = env!("CARGO_PKG_VERSION");
        let mut parts = v.split('.').map(|s| s.parse::<u32>().unwrap_or(0));
        Ok(json!({"version": format!("Ferrite v{v}"), "fields": {
            "major": parts.next().unwrap_or(0), "minor": parts.next().unwrap_or(0),
            "patch": parts.next().unwrap_or(0), "suffix": ""}}))
    });
    reg.method("rpc_get_methods", |ctx, p| async move {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        struct P {
            current: Option<bool>,
            include_aliases: Option<bool>,
        }
        let _: P = p.parse()?;
        Ok(json!(ctx.registry.method_names()))
    });
    reg.method("framework_get_reactors", |ctx, p| async move {
        p.none()?;
        let reactors: Vec<Value> = ctx
            .engine
            .stats()
            .into_iter()
            .map(|s| {
                json!({"lcore": s.core, "busy": s.busy_ticks, "idle": s.idle_ticks,
                    "in_interrupt": ctx.engine.mode() != ferrite_reactor::ReactorMode::Poll,
                    "mode": ctx.engine.mode().as_str(), "sleeps": s.sleeps,
                    "lw_threads": [{"name": format!("reactor_{}", s.id), "id": s.id,
                        "cpumask": ferrite_reactor::cpumask::format_cpumask(&[s.core]), "elapsed": s.busy_ticks + s.idle_ticks}]})
            })
            .collect();
        Ok(json!({"tick_rate": ferrite_reactor::tsc::ticks_per_sec(), "pid": std::process::id(), "reactors": reactors}))
    });
    reg.method("framework_get_subsystems", |ctx, p| async move {
        p.none()?;
        Ok(ctx.registry.subsystems().iter().map(|s| json!({"subsystem": s.name, "depends_on": s.depends_on})).collect())
    });
    reg.method("framework_get_config", |ctx, p| async move {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct P {
            name: String,
            /// Newer rpc.py sends this; Ferrite never writes batches, so it changes nothing.
            #[allow(dead_code)]
            with_batches: Option<bool>,
        }
        let P { name, .. } = p.parse()?;
        let sub = ctx
            .registry
            .subsystems()
            .iter()
            .find(|s| s.name == name)
            .ok_or_else(|| RpcError::new(INVALID_PARAMS, format!("subsystem {name:?} not found")))?;
        Ok(Value::Array((sub.config)()))
    });
    reg.method("save_config", |ctx, p| async move {
        p.none()?;
        Ok(crate::config::save(&ctx.registry))
    });
    reg.method("spdk_kill_instance", |_, p: Params| async move {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct P {
            sig_name: String,
        }
        let P { sig_name } = p.parse()?;
        let sig = match sig_name.trim_start_matches("SIG") {
            "INT" => libc::SIGINT,
            "TERM" => libc::SIGTERM,
            "QUIT" => libc::SIGQUIT,
            "HUP" => libc::SIGHUP,
            "KILL" => libc::SIGKILL,
            _ => return Err(RpcError::new(INVALID_PARAMS, format!("unknown signal {sig_name:?}"))),
        };
        log::info!("spdk_kill_instance: raising {sig_name}");
        // Raised from a helper thread after a moment, so this reply reaches the client first.
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            // SAFETY: kill with our own pid and a valid signal number.
            unsafe { libc::kill(libc::getpid(), sig) };
        });
        Ok(json!(true))
    });
}

/// Builds a registry with the framework methods, then lets `extend` add the rest.
pub fn registry(extend: impl FnOnce(&mut Registry)) -> Registry {
    let mut reg = Registry::default();
    register(&mut reg);
    extend(&mut reg);
    reg
}
