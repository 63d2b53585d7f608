//! Publishing a nexus over NVMe/TCP (`nexus_publish`, `nexus_unpublish`), as Mayastor shares
//! one: a subsystem (NQN `nqn.2019-05.io.openebs:<uuid>` unless given) with ANA reporting,
//! one namespace (the nexus bdev, with the nexus's UUID) and a listener in the ANA state asked
//! for, so that a host with paths to nexuses on two nodes can be moved from one to the other.
//!
//! Everything goes through the target's own RPC methods (`nvmf_create_transport`,
//! `nvmf_create_subsystem`, `nvmf_subsystem_add_ns`, `nvmf_subsystem_add_listener`,
//! `nvmf_subsystem_listener_set_ana_state`, `nvmf_delete_subsystem`), called through the RPC
//! registry (this crate does not link the target). The target's save_config therefore keeps a
//! publication, and replays it after the nexus (its subsystem depends on the bdev one); which
//! subsystems publish a nexus is read back from `nvmf_get_subsystems` (one namespace, the
//! nexus bdev), never kept twice.

use crate::nexus::Nexus;
use ferrite_bdev::BdevError;
use ferrite_rpc::{Ctx, Params, Registry, RpcError};
use serde_json::{json, Value};

/// The NQN prefix Mayastor's nexuses are published under.
pub const NQN_PREFIX: &str = "nqn.2019-05.io.openebs:";

/// What `nexus_publish` asks for.
#[derive(Debug, Clone)]
pub struct PublishOpts {
    /// Address to listen on.
    pub traddr: String,
    /// Port.
    pub trsvcid: String,
    /// Subsystem NQN (None: Mayastor's, from the nexus's UUID).
    pub nqn: Option<String>,
    /// ANA state of the listener ("optimized", "non_optimized", "inaccessible").
    pub ana_state: String,
}

fn rpc_err(what: &str, e: RpcError) -> BdevError {
    let errno = if e.code < 0 && e.code > -4096 { -e.code } else { libc::EINVAL };
    BdevError::Errno(errno, format!("{what}: {}", e.message))
}

async fn call(ctx: &Ctx, method: &str, params: Value) -> Result<Value, RpcError> {
    Registry::call(ctx, method, Params(Some(params))).await
}

fn listen_address(o: &PublishOpts) -> Value {
    json!({"trtype": "TCP", "adrfam": "IPv4", "traddr": o.traddr, "trsvcid": o.trsvcid})
}

/// The URI a host connects to.
fn uri(traddr: &str, trsvcid: &str, nqn: &str) -> String {
    format!("nvmf://{traddr}:{trsvcid}/{nqn}")
}

/// The subsystems that publish `n` (their only namespace is its bdev): (NQN, listeners).
pub async fn published(ctx: &Ctx, n: &Nexus) -> Vec<(String, Vec<Value>)> {
    let Ok(Value::Array(subs)) = call(ctx, "nvmf_get_subsystems", json!({})).await else { return Vec::new() };
    subs.into_iter()
        .filter(|s| {
            let ns = s["namespaces"].as_array();
            ns.is_some_and(|ns| ns.len() == 1 && ns[0]["bdev_name"] == n.name.as_str())
        })
        .map(|s| {
            let nqn = s["nqn"].as_str().unwrap_or_default().to_string();
            (nqn, s["listen_addresses"].as_array().cloned().unwrap_or_default())
        })
        .collect()
}

/// The URIs `n` is published at.
pub async fn uris(ctx: &Ctx, n: &Nexus) -> Vec<String> {
    let mut v = Vec::new();
    for (nqn, ls) in published(ctx, n).await {
        for l in ls {
            v.push(uri(l["traddr"].as_str().unwrap_or(""), l["trsvcid"].as_str().unwrap_or(""), &nqn));
        }
    }
    v
}

/// `nexus_publish`: exports `n` over NVMe/TCP; its URI. Publishing again under the same NQN
/// adds the listener, or sets its ANA state if it is there already.
pub async fn publish(ctx: &Ctx, n: &Nexus, o: &PublishOpts) -> Result<String, BdevError> {
    let nqn = o.nqn.clone().unwrap_or_else(|| format!("{NQN_PREFIX}{}", n.uuid));
    let addr = listen_address(o);
    let mine = published(ctx, n).await;
    if let Some((_, ls)) = mine.iter().find(|(q, _)| *q == nqn) {
        let same = |l: &Value| l["traddr"] == addr["traddr"] && l["trsvcid"] == addr["trsvcid"];
        let (method, what) = if ls.iter().any(same) {
            ("nvmf_subsystem_listener_set_ana_state", "set ANA state")
        } else {
            ("nvmf_subsystem_add_listener", "add listener")
        };
        call(ctx, method, json!({"nqn": nqn, "listen_address": addr, "ana_state": o.ana_state}))
            .await
            .map_err(|e| rpc_err(what, e))?;
        return Ok(uri(&o.traddr, &o.trsvcid, &nqn));
    }
    if let Some((other, _)) = mine.first() {
        return Err(BdevError::Errno(libc::EEXIST, format!("nexus {} is published already as {other}", n.name)));
    }
    let transports = call(ctx, "nvmf_get_transports", json!({})).await.map_err(|e| rpc_err("transports", e))?;
    if transports.as_array().is_none_or(|a| a.is_empty()) {
        call(ctx, "nvmf_create_transport", json!({"trtype": "TCP"})).await.map_err(|e| rpc_err("transport", e))?;
    }
    // A serial number of at most 20 characters from the UUID.
    let serial: String = n.uuid.simple().to_string().chars().take(20).collect();
    call(
        ctx,
        "nvmf_create_subsystem",
        json!({"nqn": nqn, "allow_any_host": true, "serial_number": serial,
            "model_number": "Mayastor NVMe controller", "ana_reporting": true}),
    )
    .await
    .map_err(|e| rpc_err("create subsystem", e))?;
    let rest = async {
        call(
            ctx,
            "nvmf_subsystem_add_ns",
            json!({"nqn": nqn, "namespace": {"bdev_name": n.name, "uuid": n.uuid.to_string()}}),
        )
        .await
        .map_err(|e| rpc_err("add namespace", e))?;
        call(ctx, "nvmf_subsystem_add_listener", json!({"nqn": nqn, "listen_address": addr, "ana_state": o.ana_state}))
            .await
            .map_err(|e| rpc_err("add listener", e))
    };
    if let Err(e) = rest.await {
        let _ = call(ctx, "nvmf_delete_subsystem", json!({"nqn": nqn})).await;
        return Err(e);
    }
    log::info!("nexus {}: published as {nqn} on {}:{} ({})", n.name, o.traddr, o.trsvcid, o.ana_state);
    Ok(uri(&o.traddr, &o.trsvcid, &nqn))
}

/// `nexus_unpublish`: deletes the subsystems that publish `n`; true if there was one.
pub async fn unpublish(ctx: &Ctx, n: &Nexus) -> Result<bool, BdevError> {
    let mine = published(ctx, n).await;
    for (nqn, _) in &mine {
        call(ctx, "nvmf_delete_subsystem", json!({"nqn": nqn})).await.map_err(|e| rpc_err("delete subsystem", e))?;
        log::info!("nexus {}: unpublished ({nqn})", n.name);
    }
    Ok(!mine.is_empty())
}
