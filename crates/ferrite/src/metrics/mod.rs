//! Prometheus metrics over HTTP: `--metrics ADDR` (serve, perf) and `framework_set_metrics`
//! (kept by `save_config` in the "metrics" subsystem). See `gather` for what a scrape costs.

mod expo;
mod gather;
mod http;
mod render;

use ferrite_rpc::registry::{RUNTIME, STARTUP};
use ferrite_rpc::{errno_error, Ctx, Registry, Subsystem};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::{Arc, Mutex};

/// The running endpoint and the address it was asked for (as given, for save_config). Held
/// only for a look or a swap, never across a bind or a stop: reactor 0 reads it
/// (`framework_get_metrics`, `save_config`).
static RUNNING: Mutex<Option<(String, http::Server)>> = Mutex::new(None);
/// Orders changes of the endpoint (taken off the reactors only).
static CHANGING: Mutex<()> = Mutex::new(());

fn running() -> std::sync::MutexGuard<'static, Option<(String, http::Server)>> {
    RUNNING.lock().unwrap_or_else(|e| e.into_inner())
}

/// Serves metrics on `addr` (None: stops serving); replaces an endpoint already running, once
/// the new address is bound (a bad address leaves the running endpoint as it was). Blocks
/// (bind, the stop of a previous endpoint): call off the reactors. Returns the bound address.
pub fn set(ctx: &Ctx, addr: Option<&str>) -> Result<Option<std::net::SocketAddr>, String> {
    let _order = CHANGING.lock().unwrap_or_else(|e| e.into_inner());
    if let (Some(a), Some((asked, s))) = (addr, &*running()) {
        if a == asked {
            return Ok(Some(s.addr()));
        }
    }
    let new = match addr {
        Some(a) => Some(http::Server::start(a, ctx.clone()).map_err(|e| format!("metrics address {a}: {e}"))?),
        None => None,
    };
    let bound = new.as_ref().map(http::Server::addr);
    let old = std::mem::replace(&mut *running(), new.map(|s| (addr.unwrap_or_default().to_string(), s)));
    if let Some((_, old)) = old {
        old.stop();
        log::info!("metrics: stopped");
    }
    Ok(bound)
}

/// Stops serving (at shutdown, before the reactors stop).
pub fn stop(ctx: &Ctx) {
    let _ = set(ctx, None);
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct SetParams {
    /// `host:port` to serve on, or null to stop (required: a call without it is refused, not
    /// taken as a stop).
    #[serde(deserialize_with = "Option::deserialize")]
    #[schemars(required)]
    address: Option<String>,
}

/// Registers `framework_set_metrics`, `framework_get_metrics` and the "metrics" subsystem.
pub fn register(reg: &mut Registry) {
    reg.typed_in(
        "framework_set_metrics",
        STARTUP | RUNTIME,
        "Starts, moves or stops the Prometheus metrics endpoint (`address` null stops it).",
        |ctx, p: SetParams| async move {
            let c = ctx.clone();
            let res = ferrite_reactor::spawn_blocking(move || set(&c, p.address.as_deref()))
                .await
                .map_err(|_| errno_error(libc::EIO, "metrics endpoint change panicked"))?;
            match res {
                Ok(addr) => Ok(addr.map_or(json!(true), |a| json!({"address": a.to_string()}))),
                Err(e) => Err(errno_error(libc::EINVAL, e)),
            }
        },
    );
    reg.bare_in(
        "framework_get_metrics",
        STARTUP | RUNTIME,
        "Where the Prometheus metrics endpoint listens, if it does.",
        |_| async move {
            Ok(match &*running() {
                Some((asked, s)) => json!({"address": asked, "bound": s.addr().to_string()}),
                None => json!({"address": Value::Null}),
            })
        },
    );
    reg.subsystem(Subsystem {
        name: "metrics",
        depends_on: vec![],
        config: Arc::new(|| match &*running() {
            Some((asked, _)) => vec![json!({"method": "framework_set_metrics", "params": {"address": asked}})],
            None => Vec::new(),
        }),
    });
}
