//! JSON-RPC methods of the uring module: bdev_uring_create/delete, and SPDK's
//! bdev_aio_create/delete served by the same code.

use super::{create, Flavor, UringOpts};
use ferrite_bdev::rpc::{bdev_err, delete, NameParam};
use ferrite_rpc::{Registry, RpcError, RpcResult};
use serde::Deserialize;
use serde_json::json;

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct UringCreate {
    /// Name of the bdev.
    #[schemars(example = &"Uring0")]
    name: String,
    /// The file or block device.
    #[schemars(example = &"/tmp/disk.img")]
    filename: String,
    /// Block size in bytes (the device's logical block size if not given).
    block_size: Option<u32>,
    /// The UUID to give (random if not given).
    uuid: Option<String>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct AioCreate {
    /// Name of the bdev.
    #[schemars(example = &"Aio0")]
    name: String,
    /// The file or block device.
    #[schemars(example = &"/tmp/disk.img")]
    filename: String,
    /// Block size in bytes (the device's logical block size if not given).
    block_size: Option<u32>,
    /// Read-only.
    readonly: Option<bool>,
    /// Allocate a file's space with fallocate before write zeroes.
    fallocate: Option<bool>,
    /// The UUID to give (random if not given).
    uuid: Option<String>,
    /// SPDK's RWF_NOWAIT for libaio submissions (rpc.py v26.05 always sends it). Accepted and
    /// ignored: an io_uring submission never blocks the reactor (the kernel queues what would
    /// block), which is what the flag buys libaio; the data path is the same either way.
    #[allow(dead_code)]
    nowait: Option<bool>,
}

/// Opens the file off the reactor (an open or an ioctl can block), then registers the bdev.
async fn create_off_reactor(opts: UringOpts) -> RpcResult {
    let b = ferrite_reactor::spawn_blocking(move || create(opts))
        .await
        .map_err(|e| RpcError::internal(e.to_string()))?
        .map_err(bdev_err)?;
    Ok(json!(b.name()))
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct NameOnly {
    /// The bdev.
    name: String,
}

/// Rescans off the reactor (it reads file metadata).
async fn rescan_off_reactor(name: String, module: &'static str) -> RpcResult {
    ferrite_reactor::spawn_blocking(move || super::rescan(&name, module))
        .await
        .map_err(|e| RpcError::internal(e.to_string()))?
        .map_err(bdev_err)?;
    Ok(json!(true))
}

/// Registers the module's methods.
pub fn register(reg: &mut Registry) {
    reg.typed(
        "bdev_uring_create",
        "Creates a bdev over a file or block device, with io_uring.",
        |_, p: UringCreate| async move {
            create_off_reactor(UringOpts {
                name: p.name,
                filename: p.filename,
                block_size: p.block_size,
                uuid: p.uuid,
                fallocate: true,
                ..Default::default()
            })
            .await
        },
    );
    reg.typed(
        "bdev_aio_create",
        "Creates a bdev over a file or block device (SPDK's AIO module's method; io_uring here).",
        |_, p: AioCreate| async move {
            create_off_reactor(UringOpts {
                name: p.name,
                filename: p.filename,
                block_size: p.block_size,
                uuid: p.uuid,
                readonly: p.readonly.unwrap_or(false),
                fallocate: p.fallocate.unwrap_or(false),
                flavor: Flavor::Aio,
            })
            .await
        },
    );
    reg.typed("bdev_uring_rescan", "Takes a new size of a uring bdev's file or device.", |_, p: NameOnly| async move {
        rescan_off_reactor(p.name, "uring").await
    });
    reg.typed("bdev_aio_rescan", "Takes a new size of an aio bdev's file or device.", |_, p: NameOnly| async move {
        rescan_off_reactor(p.name, "aio").await
    });
    reg.typed("bdev_uring_delete", "Deletes a uring bdev.", |_, p: NameParam| async move { delete(p, "uring").await });
    reg.typed("bdev_aio_delete", "Deletes an aio bdev.", |_, p: NameParam| async move { delete(p, "aio").await });
}
