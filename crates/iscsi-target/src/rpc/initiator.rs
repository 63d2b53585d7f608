//! Initiator groups: `iscsi_create_initiator_group`, `iscsi_initiator_group_add_initiators`,
//! `iscsi_initiator_group_remove_initiators`, `iscsi_delete_initiator_group`,
//! `iscsi_get_initiator_groups`.

use super::{at_most, invalid, no_params, parse, refused};
use crate::initiator::{added, new_group, removed};
use crate::limits::{MAX_INITIATORS, MAX_NETMASKS};
use crate::state::{with_read, with_write};
use ferrite_rpc::registry::RUNTIME;
use ferrite_rpc::{Registry, RpcError};
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Create {
    /// The initiator group's tag (a number above 0).
    tag: i32,
    /// Initiator names (IQNs, `ANY`, or with a leading `!` to deny).
    #[schemars(example = any())]
    initiators: Vec<String>,
    /// Netmasks initiators may connect from (`ANY`, or address/prefix).
    #[schemars(example = any())]
    netmasks: Vec<String>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Change {
    /// The initiator group's tag.
    tag: i32,
    /// Initiator names.
    #[serde(default)]
    initiators: Vec<String>,
    /// Netmasks.
    #[serde(default)]
    netmasks: Vec<String>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Tag {
    /// The initiator group's tag.
    tag: i32,
}

fn counts(initiators: &[String], netmasks: &[String]) -> Result<(), RpcError> {
    at_most(initiators, MAX_INITIATORS, "initiators")?;
    at_most(netmasks, MAX_NETMASKS, "netmasks")
}

fn create(a: Create) -> Result<Value, RpcError> {
    counts(&a.initiators, &a.netmasks)?;
    let g = new_group(a.tag, &a.initiators, &a.netmasks).map_err(refused)?;
    with_write(|s| s.insert_initiator_group(g)).map_err(refused)?;
    log::info!("iscsi: initiator group {} created", a.tag);
    Ok(json!(true))
}

fn change(a: Change, add: bool) -> Result<Value, RpcError> {
    counts(&a.initiators, &a.netmasks)?;
    with_write(|s| {
        s.change_initiator_group(a.tag, |g| {
            if add {
                added(g, &a.initiators, &a.netmasks)
            } else {
                removed(g, &a.initiators, &a.netmasks)
            }
        })
    })
    .map_err(refused)?;
    Ok(json!(true))
}

/// Registers the methods.
pub(super) fn register(reg: &mut Registry) {
    reg.typed_with(
        "iscsi_create_initiator_group",
        RUNTIME,
        "Creates an initiator group (initiator names and netmasks).",
        parse,
        |_, a: Create| async move { create(a) },
    );
    reg.typed_with(
        "iscsi_initiator_group_add_initiators",
        RUNTIME,
        "Adds initiator names and netmasks to an initiator group.",
        parse,
        |_, a: Change| async move { change(a, true) },
    );
    reg.typed_with(
        "iscsi_initiator_group_remove_initiators",
        RUNTIME,
        "Removes initiator names and netmasks from an initiator group.",
        parse,
        |_, a: Change| async move { change(a, false) },
    );
    reg.typed_with(
        "iscsi_delete_initiator_group",
        RUNTIME,
        "Deletes an initiator group (and its maps in every target node).",
        parse,
        |_, a: Tag| async move {
            with_write(|s| s.remove_initiator_group(a.tag))
                .ok_or_else(|| invalid(format!("initiator group {} not found", a.tag)))?;
            log::info!("iscsi: initiator group {} deleted (and unmapped from every target node)", a.tag);
            Ok(json!(true))
        },
    );
    reg.bare_with("iscsi_get_initiator_groups", RUNTIME, "The initiator groups.", no_params, |_| async move {
        Ok(Value::Array(with_read(|s| s.initiator_groups.iter().map(|g| crate::json::initiator_group(g)).collect())))
    });
}

/// The example of an initiator group's lists: anyone.
fn any() -> [&'static str; 1] {
    ["ANY"]
}
