//! Framework methods: version, method list, RPC state, reactors, subsystems, config, and
//! shutdown.

use crate::jsonrpc::{RpcError, INTERNAL_ERROR, INVALID_PARAMS};
use crate::registry::{MethodDoc, Params, ParamsDoc, Registry, Subsystem, RUNTIME, STARTUP};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

/// Registers spdk_get_version, rpc_get_methods, framework_start_init, framework_wait_init,
/// framework_get_reactors, framework_get_subsystems, framework_get_config, save_config and
/// spdk_kill_instance.
pub fn register(reg: &mut Registry) {
    reg.bare_in("spdk_get_version", STARTUP | RUNTIME, "The version of Ferrite, in SPDK's layout.", |_| async move {
        let v = env!("CARGO_PKG_VERSION");
        let mut parts = v.split('.').map(|s| s.parse::<u32>().unwrap_or(0));
        Ok(json!({"version": format!("Ferrite v{v}"), "fields": {
            "major": parts.next().unwrap_or(0), "minor": parts.next().unwrap_or(0),
            "patch": parts.next().unwrap_or(0), "suffix": ""}}))
    });
    reg.typed_in("rpc_get_methods", STARTUP | RUNTIME, "The names of the methods.", |ctx, p: GetMethods| async move {
        if p.current == Some(true) {
            return Ok(json!(ctx.registry.current_method_names()));
        }
        Ok(json!(ctx.registry.method_names()))
    });
    let summary = "Starts the framework (`--wait-for-rpc`): applies the deferred config entries, moves to runtime.";
    reg.bare_with("framework_start_init", STARTUP, summary, requires_none, |ctx| async move {
        let n = crate::config::start_init(&ctx).await.map_err(|e| RpcError::new(INTERNAL_ERROR, e))?;
        log::info!("framework started (RPC state runtime); {n} deferred config entries applied");
        Ok(json!(true))
    });
    let summary = "Answers once the framework has started.";
    reg.raw("framework_wait_init", STARTUP | RUNTIME, doc(summary), |ctx, _| async move {
        // Like SPDK's, it answers once the framework has started, however long that takes.
        while ctx.registry.state() != RUNTIME {
            ferrite_reactor::sleep(std::time::Duration::from_millis(10)).await;
        }
        Ok(json!(true))
    });
    reg.bare("framework_get_reactors", "The reactors: their cores, state and time spent busy and idle.", |ctx| async move {
        let reactors: Vec<Value> = ctx
            .engine
            .stats()
            .into_iter()
            .map(|s| {
                json!({"lcore": s.core, "busy": s.busy_ticks, "idle": s.idle_ticks,
                    "in_interrupt": ctx.engine.mode() != ferrite_reactor::ReactorMode::Poll,
                    "mode": ctx.engine.mode().as_str(), "sleeps": s.sleeps,
                    // Ferrite's additions (`ferrite top`): loop turns run, and asleep now.
                    "turns": s.turns, "sleeping": s.sleeping,
                    "lw_threads": [{"name": crate::threads::thread_name(s.id, s.core), "id": s.id + 1,
                        "cpumask": ferrite_reactor::cpumask::format_cpumask(&[s.core]), "elapsed": s.busy_ticks + s.idle_ticks}]})
            })
            .collect();
        Ok(json!({"tick_rate": ferrite_reactor::tsc::ticks_per_sec(), "pid": std::process::id(), "reactors": reactors}))
    });
    reg.bare("framework_get_subsystems", "The subsystems and what each depends on.", |ctx| async move {
        Ok(ctx.registry.subsystems().iter().map(|s| json!({"subsystem": s.name, "depends_on": s.depends_on})).collect())
    });
    reg.typed(
        "framework_get_config",
        "One subsystem's config entries, as save_config writes them.",
        |ctx, p: GetConfig| async move {
            let name = p.name;
            let sub = ctx
                .registry
                .subsystems()
                .iter()
                .find(|s| s.name == name)
                .ok_or_else(|| RpcError::new(INVALID_PARAMS, format!("subsystem {name:?} not found")))?;
            Ok(Value::Array(ctx.registry.subsystem_config(sub)))
        },
    );
    reg.bare("save_config", "The config of every subsystem (JSON that `ferrite serve -c` loads).", |ctx| async move {
        Ok(crate::config::save(&ctx.registry))
    });
    reg.typed(
        "spdk_kill_instance",
        "Raises a signal in the daemon (SIGINT and SIGTERM stop it).",
        |_, p: Kill| async move {
            let sig_name = p.sig_name;
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
        },
    );
}

/// Params of `rpc_get_methods`.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct GetMethods {
    /// Only the methods callable in the current RPC state.
    current: Option<bool>,
    /// Ferrite has no deprecated aliases, so this changes nothing.
    #[allow(dead_code)]
    include_aliases: Option<bool>,
}

/// Params of `framework_get_config`.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct GetConfig {
    /// The subsystem, e.g. `bdev`.
    name: String,
    /// Newer rpc.py sends this; Ferrite never writes batches, so it changes nothing.
    #[allow(dead_code)]
    with_batches: Option<bool>,
}

/// Params of `spdk_kill_instance`.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Kill {
    /// The signal: `SIGINT`, `SIGTERM`, `SIGQUIT`, `SIGHUP` or `SIGKILL` (`SIG` may be left out).
    #[schemars(example = &"SIGTERM")]
    sig_name: String,
}

/// SPDK's answer to params given to `framework_start_init`.
fn requires_none(method: &'static str, p: Params) -> Result<(), RpcError> {
    match p.0 {
        Some(_) => Err(RpcError::new(INVALID_PARAMS, format!("{method} requires no parameters"))),
        None => Ok(()),
    }
}

/// The doc of a method whose params are ignored.
fn doc(summary: &'static str) -> MethodDoc {
    MethodDoc { summary: summary.into(), params: ParamsDoc::Rows(Vec::new()), params_required: false }
}

/// A subsystem that only holds what option methods set.
fn options_only(name: &'static str) -> Subsystem {
    Subsystem { name, depends_on: vec![], config: Arc::new(Vec::new) }
}

/// Builds a registry with the framework, option, log and thread methods, then lets `extend` add
/// the rest. Subsystems are listed in SPDK's order: the option-only ones (scheduler, sock, ...)
/// first, those `extend` adds, then nvmf and iscsi.
pub fn registry(extend: impl FnOnce(&mut Registry)) -> Registry {
    let mut reg = Registry::default();
    register(&mut reg);
    crate::options::register(&mut reg);
    crate::logctl::register(&mut reg);
    crate::threads::register(&mut reg);
    for name in crate::options::LEADING_SUBSYSTEMS {
        reg.subsystem(options_only(name));
    }
    extend(&mut reg);
    for name in crate::options::TRAILING_SUBSYSTEMS {
        // A module may own the subsystem (the NVMe-oF target owns "nvmf"); the options it
        // holds are written first in its config either way.
        if !reg.subsystems().iter().any(|s| s.name == *name) {
            reg.subsystem(options_only(name));
        }
    }
    reg
}
