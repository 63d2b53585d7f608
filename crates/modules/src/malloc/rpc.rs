//! JSON-RPC methods of the malloc module: bdev_malloc_create, bdev_malloc_delete.

use super::{create, MallocOpts};
use ferrite_bdev::rpc::{bdev_err, check_default, check_no_metadata, delete, NameParam};
use ferrite_rpc::{Registry, RpcError};
use serde::Deserialize;
use serde_json::json;

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct MallocCreate {
    name: Option<String>,
    num_blocks: u64,
    block_size: u32,
    uuid: Option<String>,
    optimal_io_boundary: Option<u32>,
    physical_block_size: Option<u32>,
    md_size: Option<u32>,
    md_interleave: Option<bool>,
    dif_type: Option<u32>,
    dif_is_head_of_md: Option<bool>,
    dif_pi_format: Option<u32>,
    numa_id: Option<i32>,
}

/// Registers the malloc module's methods.
pub fn register(reg: &mut Registry) {
    reg.typed("bdev_malloc_create", "Creates a bdev in memory.", |_, p: MallocCreate| async move {
        check_no_metadata(p.md_size, p.dif_type)?;
        let _ = (p.md_interleave, p.dif_is_head_of_md, p.dif_pi_format);
        // SPDK writes -1 (any NUMA node); Ferrite places the memory where the kernel does.
        check_default("numa_id", p.numa_id, -1)?;
        let opts = MallocOpts {
            name: p.name,
            num_blocks: p.num_blocks,
            block_size: p.block_size,
            physical_block_size: p.physical_block_size,
            optimal_io_boundary: p.optimal_io_boundary,
            uuid: p.uuid,
        };
        // Allocating and touching the memory is slow for big disks: not on the reactor.
        let b = ferrite_reactor::spawn_blocking(move || create(opts))
            .await
            .map_err(|e| RpcError::internal(e.to_string()))?
            .map_err(bdev_err)?;
        Ok(json!(b.name()))
    });
    reg.typed(
        "bdev_malloc_delete",
        "Deletes a malloc bdev.",
        |_, p: NameParam| async move { delete(p, "malloc").await },
    );
}
