//! Portal groups: `iscsi_create_portal_group`, `iscsi_start_portal_group`,
//! `iscsi_delete_portal_group`, `iscsi_get_portal_groups`, `iscsi_portal_group_set_auth`.
//! Listening is the engine's ([`crate::PortalListener`]); without one, groups are recorded and
//! nothing listens.

use super::{at_most, invalid, no_params, parse, refused};
use crate::hooks::listener;
use crate::limits::MAX_PORTALS;
use crate::model::PortalGroup;
use crate::state::{chap, with_read, with_write};
use ferrite_rpc::jsonrpc::INVALID_PARAMS;
use ferrite_rpc::registry::RUNTIME;
use ferrite_rpc::{Registry, RpcError};
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct PortalParams {
    /// Address to listen on.
    #[schemars(example = &"127.0.0.1")]
    host: String,
    /// Port to listen on.
    #[schemars(example = &"3260")]
    port: String,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Create {
    /// The portal group's tag (a number above 0).
    tag: i32,
    /// The portals.
    portals: Vec<PortalParams>,
    /// Not announced by SendTargets (for redirection).
    #[serde(default)]
    private: bool,
    /// Do not listen until `iscsi_start_portal_group`.
    #[serde(default)]
    wait: bool,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Tag {
    /// The portal group's tag.
    tag: i32,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct SetAuth {
    /// The portal group's tag.
    tag: i32,
    /// CHAP is not used.
    disable_chap: Option<bool>,
    /// CHAP is required.
    require_chap: Option<bool>,
    /// CHAP is mutual (the target authenticates too).
    mutual_chap: Option<bool>,
    /// The auth group whose secrets CHAP uses (0: the default).
    chap_group: Option<i32>,
}

fn create(a: Create) -> Result<Value, RpcError> {
    at_most(&a.portals, MAX_PORTALS, "portals")?;
    let portals = a
        .portals
        .iter()
        .map(|p| crate::portal::portal(&p.host, &p.port))
        .collect::<Result<Vec<_>, _>>()
        .map_err(refused)?;
    let pg = with_read(|s| {
        let pg = PortalGroup { tag: a.tag, portals, private: a.private, chap: s.options.discovery, started: !a.wait };
        s.check_new_portal_group(&pg).map(|_| pg)
    })
    .map_err(refused)?;
    let l = listener();
    match &l {
        Some(l) => l.open(&pg, a.wait).map_err(|e| invalid(format!("portal group {}: {e}", a.tag)))?,
        None => log::info!(
            "iscsi: portal group {} recorded; no iSCSI engine is registered, so nothing listens on {}",
            a.tag,
            pg.portals.iter().map(|p| format!("{}:{}", p.host, p.port)).collect::<Vec<_>>().join(", ")
        ),
    }
    if let Err(r) = with_write(|s| s.insert_portal_group(pg)) {
        if let Some(l) = &l {
            l.close(a.tag);
        }
        return Err(refused(r));
    }
    log::info!(
        "iscsi: portal group {} created{}",
        a.tag,
        if a.wait { " (waiting for iscsi_start_portal_group)" } else { "" }
    );
    Ok(json!(true))
}

fn start(a: Tag) -> Result<Value, RpcError> {
    if !with_write(|s| s.change_portal_group(a.tag, |pg| pg.started = true)) {
        return Err(invalid(format!("portal group {} not found", a.tag)));
    }
    if let Some(l) = listener() {
        l.resume(a.tag);
    }
    Ok(json!(true))
}

fn delete(a: Tag) -> Result<Value, RpcError> {
    let pg = with_write(|s| s.remove_portal_group(a.tag))
        .ok_or_else(|| invalid(format!("portal group {} not found", a.tag)))?;
    if let Some(l) = listener() {
        l.close(pg.tag);
    }
    log::info!("iscsi: portal group {} deleted", a.tag);
    Ok(json!(true))
}

fn set_auth(a: SetAuth) -> Result<Value, RpcError> {
    if with_read(|s| s.portal_group(a.tag).is_none()) {
        return Err(RpcError::new(INVALID_PARAMS, format!("Could not find portal group {}", a.tag)));
    }
    let c = chap(a.disable_chap, a.require_chap, a.mutual_chap, a.chap_group).map_err(|e| {
        log::warn!("iscsi: portal group {}: {e}", a.tag);
        RpcError::new(INVALID_PARAMS, "Invalid combination of auth params")
    })?;
    with_write(|s| s.change_portal_group(a.tag, |pg| pg.chap = c));
    Ok(json!(true))
}

/// Registers the methods.
pub(super) fn register(reg: &mut Registry) {
    reg.typed_with(
        "iscsi_create_portal_group",
        RUNTIME,
        "Creates a portal group (listening addresses), started unless `wait` is set.",
        parse,
        |_, a: Create| async move { create(a) },
    );
    reg.typed_with(
        "iscsi_start_portal_group",
        RUNTIME,
        "Starts listening on a portal group created with `wait`.",
        parse,
        |_, a: Tag| async move { start(a) },
    );
    reg.typed_with("iscsi_delete_portal_group", RUNTIME, "Deletes a portal group.", parse, |_, a: Tag| async move {
        delete(a)
    });
    reg.typed_with(
        "iscsi_portal_group_set_auth",
        RUNTIME,
        "Sets how sessions through a portal group authenticate.",
        parse,
        |_, a: SetAuth| async move { set_auth(a) },
    );
    reg.bare_with("iscsi_get_portal_groups", RUNTIME, "The portal groups.", no_params, |_| async move {
        Ok(Value::Array(with_read(|s| s.portal_groups.iter().map(|g| crate::json::portal_group(g)).collect())))
    });
}
