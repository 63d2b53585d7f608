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

/// The running endpoint and the address it was asked for (as given, for save_config).
static RUNNING: Mutex<Option<(String, http::Server)>> = Mutex::new(None);

fn running() -> std::sync::MutexGuard<'static, Option<(String, http::Server)>> {
    RUNNING.lock().unwrap_or_else(|e| e.into_inner())
}

/// Serves metrics on `addr` (None: stops serving); replaces an endpoint already running.
/// Blocks (bind, and the join of a previous endpoint): call off the reactors. Returns the
/// bound address.
pub fn set(ctx: &Ctx, addr: Option<&str>) -> Result<Option<std::net::SocketAddr>, String> {
    let mut cur = running();
    if let Some((_, old)) = cur.take() {
        if let Some(t) = old.stop() {
            let _ = t.join();
        }
        log::info!("metrics: stopped");
    }
    let Some(addr) = addr else { return Ok(None) };
    let server = http::Server::start(addr, ctx.clone()).map_err(|e| format!("metrics address {addr}: {e}"))?;
    let bound = server.addr();
    *cur = Some((addr.to_string(), server));
    Ok(Some(bound))
}

/// Stops serving (at shutdown, before the reactors stop).
pub fn stop(ctx: &Ctx) {
    let _ = set(ctx, None);
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct SetParams {
    /// `host:port` to serve on, or null to stop.
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
