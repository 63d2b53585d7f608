//! Auth groups and the discovery auth: `iscsi_create_auth_group`, `iscsi_delete_auth_group`,
//! `iscsi_auth_group_add_secret`, `iscsi_auth_group_remove_secret`, `iscsi_get_auth_groups`,
//! `iscsi_set_discovery_auth`.

use super::{at_most, no_params, parse, strerror};
use crate::limits::MAX_SECRETS_PER_CALL;
use crate::state::{chap, with_read, with_write};
use ferrite_rpc::jsonrpc::INVALID_PARAMS;
use ferrite_rpc::{Params, Registry, RpcError};
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SecretParams {
    user: String,
    secret: String,
    muser: Option<String>,
    msecret: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Create {
    tag: i32,
    #[serde(default)]
    secrets: Vec<SecretParams>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Tag {
    tag: i32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AddSecret {
    tag: i32,
    user: String,
    secret: String,
    muser: Option<String>,
    msecret: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RemoveSecret {
    tag: i32,
    user: String,
}

/// The four CHAP members of `iscsi_set_discovery_auth` and the other `*_set_auth` methods.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Chap {
    disable_chap: Option<bool>,
    require_chap: Option<bool>,
    mutual_chap: Option<bool>,
    chap_group: Option<i32>,
}

fn err(msg: String) -> RpcError {
    log::warn!("iscsi: {msg}");
    RpcError::new(INVALID_PARAMS, msg)
}

fn create(p: Params) -> Result<Value, RpcError> {
    let a: Create = parse(p)?;
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

fn add_secret(p: Params) -> Result<Value, RpcError> {
    let a: AddSecret = parse(p)?;
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

fn remove_secret(p: Params) -> Result<Value, RpcError> {
    let a: RemoveSecret = parse(p)?;
    with_write(|s| {
        if s.auth_group(a.tag).is_none() {
            return Err(err(format!("Could not find auth group ({})", a.tag)));
        }
        s.remove_secret(a.tag, &a.user)
            .map_err(|r| err(format!("Could not delete secret from CHAP group ({}), {}", a.tag, strerror(r.errno))))
    })?;
    Ok(json!(true))
}

fn set_discovery_auth(p: Params) -> Result<Value, RpcError> {
    let a: Chap = parse(p)?;
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
    reg.method("iscsi_create_auth_group", |_, p| async move { create(p) });
    reg.method("iscsi_delete_auth_group", |_, p| async move {
        let a: Tag = parse(p)?;
        with_write(|s| s.delete_auth_group(a.tag))
            .map_err(|_| err(format!("Could not find auth group ({})", a.tag)))?;
        Ok(json!(true))
    });
    reg.method("iscsi_auth_group_add_secret", |_, p| async move { add_secret(p) });
    reg.method("iscsi_auth_group_remove_secret", |_, p| async move { remove_secret(p) });
    reg.method("iscsi_get_auth_groups", |_, p| async move {
        no_params(&p, "iscsi_get_auth_groups")?;
        Ok(Value::Array(with_read(|s| s.auth_groups.iter().map(|g| crate::json::auth_group(g)).collect())))
    });
    reg.method("iscsi_set_discovery_auth", |_, p| async move { set_discovery_auth(p) });
}
