//! Target nodes: `iscsi_create_target_node`, `iscsi_delete_target_node`,
//! `iscsi_target_node_add_lun`, `iscsi_target_node_add_pg_ig_maps`,
//! `iscsi_target_node_remove_pg_ig_maps`, `iscsi_target_node_set_auth`,
//! `iscsi_target_node_set_redirect`, `iscsi_target_node_request_logout`,
//! `iscsi_get_target_nodes`.

use super::{at_most, invalid, no_params, parse, refused};
use crate::hooks::sessions;
use crate::limits::{MAX_LUNS_PER_CALL, MAX_PG_IG_MAPS_PER_CALL, MAX_TARGET_NAME};
use crate::model::{Redirect, Refused, TargetNode};
use crate::state::{chap, lun_id, with_read, with_write};
use ferrite_rpc::jsonrpc::INVALID_PARAMS;
use ferrite_rpc::registry::RUNTIME;
use ferrite_rpc::{Registry, RpcError};
use serde::Deserialize;
use serde_json::{json, Value};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct MapParams {
    /// A portal group's tag.
    pg_tag: i32,
    /// An initiator group's tag.
    ig_tag: i32,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct LunParams {
    /// SPDK's decoder leaves an absent id at 0.
    #[serde(default)]
    lun_id: i32,
    /// The bdev of the LUN.
    #[schemars(example = &"Malloc0")]
    bdev_name: Option<String>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Create {
    /// The target node's name (an IQN, or a suffix of the node base).
    #[schemars(example = &"disk1")]
    name: String,
    /// Required by SPDK's decoder, yet SPDK's save_config leaves it out for a node without an
    /// alias (so SPDK cannot load such a config of its own): optional here.
    #[serde(default)]
    alias_name: String,
    /// Portal group to initiator group maps.
    pg_ig_maps: Vec<MapParams>,
    /// The LUNs.
    luns: Vec<LunParams>,
    /// Commands outstanding per session.
    #[schemars(example = 64)]
    queue_depth: i32,
    /// CHAP is not used.
    disable_chap: Option<bool>,
    /// CHAP is required.
    require_chap: Option<bool>,
    /// CHAP is mutual (the target authenticates too).
    mutual_chap: Option<bool>,
    /// The auth group whose secrets CHAP uses (0: the default).
    chap_group: Option<i32>,
    /// Require the header digest (CRC32C).
    #[serde(default)]
    header_digest: bool,
    /// Require the data digest (CRC32C).
    #[serde(default)]
    data_digest: bool,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Name {
    /// The target node.
    name: String,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct AddLun {
    /// The target node.
    name: String,
    /// The bdev of the LUN.
    bdev_name: String,
    /// The LUN number (the next free one if not given).
    lun_id: Option<i32>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Maps {
    /// The target node.
    name: String,
    /// Portal group to initiator group maps.
    pg_ig_maps: Vec<MapParams>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct SetAuth {
    /// The target node.
    name: String,
    /// CHAP is not used.
    disable_chap: Option<bool>,
    /// CHAP is required.
    require_chap: Option<bool>,
    /// CHAP is mutual (the target authenticates too).
    mutual_chap: Option<bool>,
    /// The auth group whose secrets CHAP uses (0: the default).
    chap_group: Option<i32>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct SetRedirect {
    /// The target node.
    name: String,
    /// The portal group whose logins are redirected.
    pg_tag: i32,
    /// Address to redirect to (none: stop redirecting).
    redirect_host: Option<String>,
    /// Port to redirect to.
    redirect_port: Option<String>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Logout {
    /// The target node.
    name: String,
    /// Only sessions through this portal group (all if not given).
    pg_tag: Option<i32>,
}

fn pairs(maps: &[MapParams]) -> Vec<(i32, i32)> {
    maps.iter().map(|m| (m.pg_tag, m.ig_tag)).collect()
}

/// Opens the LUNs of a new node `node` (without LUNs yet) as `luns` asks, in order.
fn open_luns(node: &mut TargetNode, luns: &[LunParams]) -> Result<(), Refused> {
    if luns.is_empty() {
        return Err(Refused::invalid(format!("device {}: no LUNs specified", node.name)));
    }
    if !luns.iter().any(|l| l.lun_id == 0) {
        return Err(Refused::invalid(format!("device {}: no LUN 0 specified", node.name)));
    }
    for l in luns {
        let Some(bdev) = &l.bdev_name else {
            return Err(Refused::invalid(format!("no bdev for LUN {}", l.lun_id)));
        };
        let id = lun_id(node, l.lun_id)?;
        let lun = crate::lun::open(node.id, id, bdev)?;
        node.insert_lun(Arc::new(lun));
    }
    Ok(())
}

fn create(a: Create) -> Result<Value, RpcError> {
    at_most(&a.pg_ig_maps, MAX_PG_IG_MAPS_PER_CALL, "pg_ig_maps")?;
    at_most(&a.luns, MAX_LUNS_PER_CALL, "luns")?;
    let c = chap(a.disable_chap, a.require_chap, a.mutual_chap, a.chap_group).map_err(invalid)?;
    if a.pg_ig_maps.is_empty() {
        return Err(invalid("pg_ig_maps is empty"));
    }
    let (name, max_qd, id) = with_write(|s| {
        (crate::name::full_name(&s.options.node_base, &a.name), s.options.max_queue_depth, s.new_target_id())
    });
    crate::name::check(&name).map_err(|e| invalid(format!("TargetName {}: {e}", a.name)))?;
    if a.alias_name.len() > MAX_TARGET_NAME {
        return Err(invalid(format!("alias_name is longer than {MAX_TARGET_NAME} bytes")));
    }
    // SPDK keeps a queue depth from 1 to max_queue_depth, and takes max_queue_depth otherwise.
    let queue_depth = match u32::try_from(a.queue_depth) {
        Ok(q) if q > 0 && q <= max_qd => q,
        _ => max_qd,
    };
    let node = TargetNode {
        id,
        name: name.clone(),
        alias: (!a.alias_name.is_empty()).then(|| a.alias_name.clone()),
        pg_maps: Vec::new(),
        luns: Vec::new(),
        queue_depth,
        chap: c,
        header_digest: a.header_digest,
        data_digest: a.data_digest,
    };
    // What needs no bdev first, then the LUNs, then the node goes in (checked again: RPCs run
    // one at a time, but the maps' groups are checked under the lock that inserts).
    let maps = pairs(&a.pg_ig_maps);
    with_read(|s| {
        if s.target(&name).is_some() {
            return Err(Refused::new(libc::EEXIST, format!("target {name} exists")));
        }
        s.with_maps_added(&node, &maps).map(|_| ())
    })
    .map_err(refused)?;
    let mut node = node;
    open_luns(&mut node, &a.luns).map_err(refused)?;
    with_write(|s| {
        let node = s.with_maps_added(&node, &maps)?;
        s.insert_target(node)
    })
    .map_err(refused)?;
    log::info!("iscsi: target node {name} created");
    Ok(json!(true))
}

async fn delete(a: Name) -> Result<Value, RpcError> {
    let Some(t) = with_write(|s| s.remove_target(&a.name)) else {
        return Err(RpcError::new(-libc::ENOENT, super::strerror(libc::ENOENT)));
    };
    // As SPDK: new logins find no node; those logged in are asked to log out, and the node's
    // LUNs close once none is left (the engine drops its snapshots as they go).
    if let Some(s) = sessions() {
        s.request_logout(&t.name, None);
        let deadline = Instant::now() + Duration::from_secs(40);
        while s.active_connections(&t.name) > 0 {
            if Instant::now() > deadline {
                log::warn!("iscsi: target node {}: connections still logged in after 40 s", t.name);
                break;
            }
            ferrite_reactor::sleep(Duration::from_millis(10)).await;
        }
    }
    log::info!("iscsi: target node {} deleted", t.name);
    Ok(json!(true))
}

fn add_lun(a: AddLun) -> Result<Value, RpcError> {
    let t =
        with_read(|s| s.target(&a.name).cloned()).ok_or_else(|| invalid(format!("target {} is not found", a.name)))?;
    if let Some(n) = sessions().map(|s| s.active_connections(&t.name)).filter(|n| *n > 0) {
        return Err(invalid(format!("target has active connections (count={n})")));
    }
    let id = lun_id(&t, a.lun_id.unwrap_or(-1)).map_err(refused)?;
    let lun = Arc::new(crate::lun::open(t.id, id, &a.bdev_name).map_err(refused)?);
    with_write(|s| {
        s.change_target(&t.name, |_, n| {
            let mut n = n.clone();
            if n.lun(id).is_some() {
                return Err(Refused::new(libc::EEXIST, "LUN ID is duplicated"));
            }
            n.insert_lun(lun);
            Ok(n)
        })
    })
    .map_err(refused)?;
    log::info!("iscsi: target node {}: LUN {id} is bdev {}", t.name, a.bdev_name);
    Ok(json!(true))
}

fn change_maps(a: Maps, add: bool) -> Result<Value, RpcError> {
    at_most(&a.pg_ig_maps, MAX_PG_IG_MAPS_PER_CALL, "pg_ig_maps")?;
    let maps = pairs(&a.pg_ig_maps);
    with_write(|s| {
        s.change_target(&a.name, |s, n| if add { s.with_maps_added(n, &maps) } else { s.with_maps_removed(n, &maps) })
    })
    .map_err(refused)?;
    Ok(json!(true))
}

fn set_auth(a: SetAuth) -> Result<Value, RpcError> {
    if with_read(|s| s.target(&a.name).is_none()) {
        return Err(RpcError::new(INVALID_PARAMS, format!("Could not find target {}", a.name)));
    }
    let c = chap(a.disable_chap, a.require_chap, a.mutual_chap, a.chap_group).map_err(|e| {
        log::warn!("iscsi: target {}: {e}", a.name);
        RpcError::new(INVALID_PARAMS, "Invalid combination of auth params")
    })?;
    with_write(|s| {
        s.change_target(&a.name, |_, n| {
            let mut n = n.clone();
            n.chap = c;
            Ok(n)
        })
    })
    .map_err(refused)?;
    Ok(json!(true))
}

/// A numeric host and port as SPDK's redirect takes them (`getaddrinfo` with
/// `AI_NUMERICHOST | AI_NUMERICSERV`: an address without brackets, a decimal port).
fn redirect_addr(host: &str, port: &str) -> Result<(), String> {
    host.parse::<IpAddr>().map_err(|_| format!("{host} is not a numeric IP address"))?;
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) || port.parse::<u16>().is_err() {
        return Err(format!("{port} is not a numeric port"));
    }
    Ok(())
}

fn set_redirect(a: SetRedirect) -> Result<Value, RpcError> {
    if with_read(|s| s.target(&a.name).is_none()) {
        return Err(RpcError::new(INVALID_PARAMS, format!("Target {} is not found", a.name)));
    }
    let fail = |why: String| {
        log::warn!("iscsi: failed to redirect target {}: {why}", a.name);
        RpcError::new(
            INVALID_PARAMS,
            format!("Failed to redirect target {}, ({}): {}", a.name, -libc::EINVAL, super::strerror(libc::EINVAL)),
        )
    };
    let redirect = match (&a.redirect_host, &a.redirect_port) {
        (None, None) => None,
        (Some(h), Some(p)) => {
            redirect_addr(h, p).map_err(fail)?;
            Some(Redirect { host: h.clone(), port: p.clone() })
        }
        _ => return Err(fail("redirect_host and redirect_port go together".into())),
    };
    with_write(|s| {
        s.change_target(&a.name, |s, n| {
            let pg = s
                .portal_group(a.pg_tag)
                .ok_or_else(|| Refused::invalid(format!("portal group {} is not found", a.pg_tag)))?;
            if pg.private {
                return Err(Refused::invalid(format!("portal group {} is not a public portal group", a.pg_tag)));
            }
            if let Some(r) = &redirect {
                if pg.portals.iter().any(|p| p.host == r.host && p.port == r.port) {
                    return Err(Refused::invalid("the redirect address must be another portal group's"));
                }
            }
            let mut n = n.clone();
            let m = n.pg_maps.iter_mut().find(|m| m.pg_tag == a.pg_tag);
            m.ok_or_else(|| Refused::invalid(format!("portal group {} is not mapped", a.pg_tag)))?.redirect = redirect;
            Ok(n)
        })
    })
    .map_err(|r| fail(r.why))?;
    Ok(json!(true))
}

fn request_logout(a: Logout) -> Result<Value, RpcError> {
    let name = with_read(|s| s.target(&a.name).map(|t| t.name.clone()))
        .ok_or_else(|| RpcError::new(INVALID_PARAMS, format!("Target {} is not found", a.name)))?;
    if let Some(s) = sessions() {
        s.request_logout(&name, a.pg_tag.filter(|t| *t >= 0));
    }
    Ok(json!(true))
}

/// Registers the methods.
pub(super) fn register(reg: &mut Registry) {
    reg.typed_with(
        "iscsi_create_target_node",
        RUNTIME,
        "Creates an iSCSI target node with LUNs over bdevs and portal/initiator group maps.",
        parse,
        |_, a: Create| async move { create(a) },
    );
    reg.typed_with(
        "iscsi_delete_target_node",
        RUNTIME,
        "Deletes a target node (its sessions are closed).",
        parse,
        |_, a: Name| delete(a),
    );
    reg.typed_with(
        "iscsi_target_node_add_lun",
        RUNTIME,
        "Adds a LUN over a bdev to a target node.",
        parse,
        |_, a: AddLun| async move { add_lun(a) },
    );
    reg.typed_with(
        "iscsi_target_node_add_pg_ig_maps",
        RUNTIME,
        "Maps portal groups to initiator groups for a target node.",
        parse,
        |_, a: Maps| async move { change_maps(a, true) },
    );
    reg.typed_with(
        "iscsi_target_node_remove_pg_ig_maps",
        RUNTIME,
        "Removes portal group to initiator group maps from a target node.",
        parse,
        |_, a: Maps| async move { change_maps(a, false) },
    );
    reg.typed_with(
        "iscsi_target_node_set_auth",
        RUNTIME,
        "Sets how a target node's sessions authenticate.",
        parse,
        |_, a: SetAuth| async move { set_auth(a) },
    );
    reg.typed_with(
        "iscsi_target_node_set_redirect",
        RUNTIME,
        "Redirects logins to a target node through a portal group to another address.",
        parse,
        |_, a: SetRedirect| async move { set_redirect(a) },
    );
    reg.typed_with(
        "iscsi_target_node_request_logout",
        RUNTIME,
        "Asks the initiators of a target node (through one portal group, or all) to log out.",
        parse,
        |_, a: Logout| async move { request_logout(a) },
    );
    reg.bare_with("iscsi_get_target_nodes", RUNTIME, "The target nodes.", no_params, |_| async move {
        Ok(Value::Array(with_read(|s| s.targets.iter().map(|t| crate::json::target_node(t)).collect())))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirects_take_numeric_addresses_only() {
        assert!(redirect_addr("127.0.0.1", "3260").is_ok());
        assert!(redirect_addr("::1", "3260").is_ok());
        for (h, p) in
            [("[::1]", "3260"), ("localhost", "3260"), ("127.0.0.1", "abc"), ("127.0.0.1", "99999"), ("127.0.0.1", "")]
        {
            assert!(redirect_addr(h, p).is_err(), "{h} {p}");
        }
    }
}
