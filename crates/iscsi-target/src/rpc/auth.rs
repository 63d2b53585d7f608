//! Auth groups and the discovery auth: `iscsi_create_auth_group`, `iscsi_delete_auth_group`,
//! `iscsi_auth_group_add_secret`, `iscsi_auth_group_remove_secret`, `iscsi_get_auth_groups`,
//! `iscsi_set_discovery_auth`.

use super::{at_most, no_params, parse, strerror};
use crate::limits::MAX_SECRETS_PER_CALL;
use crate::state::{chap, with_read, with_write};
use ferrite_rpc::jsonrpc::INVALID_PARAMS;
use ferrite_rpc::registry::RUNTIME;
use ferrite_rpc::{Registry, RpcError};
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct SecretParams {
    /// CHAP user name.
    user: String,
    /// CHAP secret.
    secret: String,
    /// Mutual CHAP user name.
    muser: Option<String>,
    /// Mutual CHAP secret.
    msecret: Option<String>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Create {
    /// The auth group's tag (a number above 0).
    tag: i32,
    /// Its secrets.
    #[serde(default)]
    secrets: Vec<SecretParams>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Tag {
    /// The auth group's tag.
    tag: i32,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct AddSecret {
    /// The auth group's tag.
    tag: i32,
    /// CHAP user name.
    user: String,
    /// CHAP secret.
    secret: String,
    /// Mutual CHAP user name.
    muser: Option<String>,
    /// Mutual CHAP secret.
    msecret: Option<String>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RemoveSecret {
    /// The auth group's tag.
    tag: i32,
    /// The CHAP user name whose secret goes.
    user: String,
}

/// The four CHAP members of `iscsi_set_discovery_auth` and the other `*_set_auth` methods.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Chap {
    /// CHAP is not used.
    disable_chap: Option<bool>,
    /// CHAP is required.
    require_chap: Option<bool>,
    /// CHAP is mutual (the target authenticates too).
    mutual_chap: Option<bool>,
    /// The auth group whose secrets CHAP uses (0: the default).
    chap_group: Option<i32>,
}

fn err(msg: String) -> RpcError {
    log::warn!("iscsi: {msg}");
    RpcError::new(INVALID_PARAMS, msg)
}

fn create(a: Create) -> Result<Value, RpcError> {
    at_most(&a.secrets, MAX_SECRETS_PER_CALL, "secrets")?;
    with_write(|s| {
        if s.auth_group(a.tag).is_some() {
            return Err(err(format!("Could not add auth group ({}), {}", a.tag, strerror(libc::EEXIST))));
        }
        let mut secrets = Vec::new();
        for x in &a.secrets {
            let sec = crate::auth::secret(&x.user, &x.secret, x.muser.as_deref(), x.msecret.as_deref())
                .map_err(|r| err(format!("Could not add secret to auth group ({}), {}", a.tag, strerror(r.errno))))?;
            secrets.push(sec);
        }
        s.create_auth_group(a.tag, secrets)
            .map_err(|r| err(format!("Could not add secret to auth group ({}), {}", a.tag, strerror(r.errno))))
    })?;
    log::info!("iscsi: auth group {} created", a.tag);
    Ok(json!(true))
}

fn add_secret(a: AddSecret) -> Result<Value, RpcError> {
    with_write(|s| {
        if s.auth_group(a.tag).is_none() {
            return Err(err(format!("Could not find auth group ({})", a.tag)));
        }
        crate::auth::secret(&a.user, &a.secret, a.muser.as_deref(), a.msecret.as_deref())
            .and_then(|sec| s.add_secret(a.tag, sec))
            .map_err(|r| err(format!("Could not add secret to auth group ({}), {}", a.tag, strerror(r.errno))))
    })?;
    Ok(json!(true))
}

fn remove_secret(a: RemoveSecret) -> Result<Value, RpcError> {
    with_write(|s| {
        if s.auth_group(a.tag).is_none() {
            return Err(err(format!("Could not find auth group ({})", a.tag)));
        }
        s.remove_secret(a.tag, &a.user)
            .map_err(|r| err(format!("Could not delete secret from CHAP group ({}), {}", a.tag, strerror(r.errno))))
    })?;
    Ok(json!(true))
}

fn set_discovery_auth(a: Chap) -> Result<Value, RpcError> {
    let c = chap(a.disable_chap, a.require_chap, a.mutual_chap, a.chap_group).map_err(|e| {
        log::warn!("iscsi: discovery auth: {e}");
        RpcError::new(INVALID_PARAMS, "Invalid combination of CHAP params")
    })?;
    with_write(|s| s.options.discovery = c);
    log::info!("iscsi: discovery auth set: {c:?}");
    Ok(json!(true))
}

/// Registers the methods.
pub(super) fn register(reg: &mut Registry) {
    reg.typed_with(
        "iscsi_create_auth_group",
        RUNTIME,
        "Creates a CHAP authentication group.",
        parse,
        |_, a: Create| async move { create(a) },
    );
    reg.typed_with(
        "iscsi_delete_auth_group",
        RUNTIME,
        "Deletes an authentication group.",
        parse,
        |_, a: Tag| async move {
            with_write(|s| s.delete_auth_group(a.tag))
                .map_err(|_| err(format!("Could not find auth group ({})", a.tag)))?;
            Ok(json!(true))
        },
    );
    reg.typed_with(
        "iscsi_auth_group_add_secret",
        RUNTIME,
        "Adds a CHAP secret to an authentication group.",
        parse,
        |_, a: AddSecret| async move { add_secret(a) },
    );
    reg.typed_with(
        "iscsi_auth_group_remove_secret",
        RUNTIME,
        "Removes a CHAP secret from an authentication group.",
        parse,
        |_, a: RemoveSecret| async move { remove_secret(a) },
    );
    reg.bare_with(
        "iscsi_get_auth_groups",
        RUNTIME,
        "The authentication groups and their secrets.",
        no_params,
        |_| async move {
            Ok(Value::Array(with_read(|s| s.auth_groups.iter().map(|g| crate::json::auth_group(g)).collect())))
        },
    );
    reg.typed_with(
        "iscsi_set_discovery_auth",
        RUNTIME,
        "Sets how discovery sessions authenticate (CHAP, mutual CHAP, the auth group).",
        parse,
        |_, a: Chap| async move { set_discovery_auth(a) },
    );
}
