//! SPDK's `bdev_iscsi_create` {name, url, initiator_iqn} (answers the bdev's name) and
//! `bdev_iscsi_delete` {name}; `bdev_iscsi_set_options` is an option method
//! ([`crate::options`]). Errors are SPDK's codes, with what is wrong after SPDK's words:
//! params that do not decode -32603 ("spdk_json_decode_object failed"), a bad URL or an empty
//! initiator name -22 ("Invalid argument"), a name in use or a target that cannot be reached,
//! refuses the login or has no such block LUN -32602, an unknown name at delete -19 ("No such
//! device").

use crate::attach::{attach, AttachError, AttachOpts};
use crate::lun::{lun_of, MODULE};
use ferrite_rpc::jsonrpc::{INTERNAL_ERROR, INVALID_PARAMS};
use ferrite_rpc::registry::RUNTIME;
use ferrite_rpc::{errno_error, Params, Registry, RpcError};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::json;
use std::sync::atomic::Ordering;

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Create {
    /// Name of the bdev.
    name: String,
    /// The LUN: `iscsi://[user[%password]@]host[:port]/iqn/lun`.
    url: String,
    /// The initiator's IQN.
    initiator_iqn: String,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Delete {
    /// The iSCSI bdev.
    name: String,
}

/// Params decoded as SPDK's handlers do (-32603 when they do not).
fn decode<T: DeserializeOwned>(_: &'static str, p: Params) -> Result<T, RpcError> {
    p.parse().map_err(|e: RpcError| {
        let why = e.message.strip_prefix("Invalid parameters: ").unwrap_or(&e.message).to_string();
        RpcError::new(INTERNAL_ERROR, format!("spdk_json_decode_object failed: {why}"))
    })
}

fn create_error(e: AttachError) -> RpcError {
    match e {
        AttachError::Invalid(m) => errno_error(libc::EINVAL, format!("Invalid argument: {m}")),
        AttachError::Exists(m) => RpcError::new(INVALID_PARAMS, format!("File exists: {m}")),
        AttachError::Failed(m) => RpcError::new(INVALID_PARAMS, format!("iSCSI error: {m}")),
    }
}

/// Registers the methods (and the option method).
pub fn register(reg: &mut Registry) {
    crate::options::register(reg);
    reg.typed_with(
        "bdev_iscsi_create",
        RUNTIME,
        "Attaches a remote iSCSI LUN as a bdev.",
        decode,
        |ctx, a: Create| async move {
            let set = ctx.registry.settings().get("bdev_iscsi_set_options", None);
            let timeout_sec = crate::options::timeout_sec(set.as_ref());
            let opts = AttachOpts { name: a.name, url: a.url, initiator_iqn: a.initiator_iqn, timeout_sec };
            let bdev = attach(opts).await.map_err(create_error)?;
            Ok(json!(bdev.name()))
        },
    );
    reg.typed_with("bdev_iscsi_delete", RUNTIME, "Detaches an iSCSI bdev.", decode, |_, a: Delete| async move {
        let no_such = || errno_error(libc::ENODEV, format!("No such device: bdev {} not found", a.name));
        let bdev = ferrite_bdev::lookup(&a.name).ok_or_else(no_such)?;
        let lun = lun_of(&bdev).ok_or_else(no_such)?;
        // Its sessions stop logging in and fail what waits; what the target has ends.
        lun.removed.store(true, Ordering::Release);
        let done = ferrite_bdev::unregister(bdev.name(), Some(MODULE)).map_err(ferrite_bdev::rpc::bdev_err)?;
        done.await.map_err(|e| RpcError::internal(e.to_string()))?;
        Ok(json!(true))
    });
}

/// Daemon shutdown (on the first reactor, before the bdevs go): every iSCSI bdev's sessions
/// stop logging in (its target may be going away too, Ferrite's own included) and what waits
/// fails; the bdevs are then unregistered with the others.
pub fn shutdown() {
    for b in ferrite_bdev::list() {
        if let Some(lun) = lun_of(&b) {
            lun.removed.store(true, Ordering::Release);
        }
    }
}
