//! JSON-RPC methods of the passthru module: bdev_passthru_create, bdev_passthru_delete.

use super::base::{delete, rpc_err, NameParam};
use super::{create, deferred, MODULE};
use ferrite_rpc::Registry;
use serde::Deserialize;
use serde_json::json;

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct PassthruCreate {
    /// The base bdev.
    #[schemars(example = &"Malloc0")]
    base_bdev_name: String,
    /// Name of the passthru bdev.
    #[schemars(example = &"Passthru0")]
    name: String,
    /// The UUID to give (random if not given).
    uuid: Option<String>,
}

/// Registers the passthru module's methods.
pub fn register(reg: &mut Registry) {
    reg.typed("bdev_passthru_create", "Creates a passthru bdev over a base bdev.", |_, p: PassthruCreate| async move {
        let (base, name, uuid) = (p.base_bdev_name.clone(), p.name.clone(), p.uuid.clone());
        // Over a base that is not there yet, the passthru bdev appears when the base does.
        deferred::create_or_defer(MODULE, &p.base_bdev_name, &p.name, move || create(&base, &name, uuid.as_deref()))
            .map_err(rpc_err)?;
        Ok(json!(p.name))
    });
    reg.typed("bdev_passthru_delete", "Deletes a passthru bdev.", |_, p: NameParam| async move {
        if deferred::forget(MODULE, &p.name) {
            return Ok(json!(true));
        }
        delete(&p.name, MODULE).await
    });
}
