//! JSON-RPC methods of the malloc module: bdev_malloc_create, bdev_malloc_delete.

use super::{create, MallocOpts};
use ferrite_bdev::rpc::{bdev_err, check_default, check_no_metadata, delete, NameParam};
use ferrite_rpc::{Registry, RpcError};
use serde::Deserialize;
use serde_json::json;

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct MallocCreate {
    /// Name of the bdev (`MallocN` if not given).
    name: Option<String>,
    /// Number of blocks.
    #[schemars(example = 16384)]
    num_blocks: u64,
    /// Block size in bytes.
    #[schemars(example = 512)]
    block_size: u32,
    /// The UUID to give (random if not given).
    uuid: Option<String>,
    /// Boundary in blocks I/O should not cross (0: none).
    optimal_io_boundary: Option<u32>,
    /// Physical block size in bytes reported to users (0: the block size).
    physical_block_size: Option<u32>,
    /// Metadata bytes per block: only 0 (no metadata/DIF).
    md_size: Option<u32>,
    /// Metadata interleaved with data (SPDK's; no metadata here).
    md_interleave: Option<bool>,
    /// DIF type: only 0.
    dif_type: Option<u32>,
    /// DIF at the head of the metadata (SPDK's; no metadata here).
    dif_is_head_of_md: Option<bool>,
    /// DIF PI format (SPDK's; no metadata here).
    dif_pi_format: Option<u32>,
    /// SPDK's NUMA node (-1: any); Ferrite places memory where the kernel does.
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
