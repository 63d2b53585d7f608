//! JSON-RPC methods of the passthru module: bdev_passthru_create, bdev_passthru_delete.

use super::base::{delete, rpc_err, NameParam};
use super::{create, deferred, MODULE};
use ferrite_rpc::{Params, Registry};
use serde::Deserialize;
use serde_json::json;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PassthruCreate {
    base_bdev_name: String,
    name: String,
    uuid: Option<String>,
}

/// Registers the passthru module's methods.
pub fn register(reg: &mut Registry) {
    reg.method("bdev_passthru_create", |_, p: Params| async move {
        let p: PassthruCreate = p.parse()?;
        let (base, name, uuid) = (p.base_bdev_name.clone(), p.name.clone(), p.uuid.clone());
        // Over a base that is not there yet, the passthru bdev appears when the base does.
        deferred::create_or_defer(MODULE, &p.base_bdev_name, &p.name, move || create(&base, &name, uuid.as_deref()))
            .map_err(rpc_err)?;
        Ok(json!(p.name))
    });
    reg.method("bdev_passthru_delete", |_, p: Params| async move {
        let p: NameParam = p.parse()?;
        if deferred::forget(MODULE, &p.name) {
            return Ok(json!(true));
        }
        delete(&p.name, MODULE).await
    });
}
