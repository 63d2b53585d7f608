//! JSON-RPC methods of the null module: bdev_null_create, bdev_null_delete.

use super::{create, NullOpts};
use ferrite_bdev::rpc::{bdev_err, check_default, check_no_metadata, delete, NameParam};
use ferrite_rpc::Registry;
use serde::Deserialize;
use serde_json::json;

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct NullCreate {
    /// Name of the bdev.
    #[schemars(example = &"Null0")]
    name: String,
    /// Number of blocks.
    #[schemars(example = 16384)]
    num_blocks: u64,
    /// Block size in bytes.
    #[schemars(example = 512)]
    block_size: u32,
    /// The UUID to give (random if not given).
    uuid: Option<String>,
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
    /// SPDK's hint (only its default).
    preferred_write_granularity: Option<u32>,
    /// SPDK's hint (only its default).
    preferred_write_alignment: Option<u32>,
    /// SPDK's hint (only its default).
    optimal_write_size: Option<u32>,
    /// SPDK's hint (only its default).
    preferred_unmap_granularity: Option<u32>,
    /// SPDK's hint (only its default).
    preferred_unmap_alignment: Option<u32>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct NullResize {
    /// The null bdev.
    name: String,
    /// New size in MiB.
    new_size: u64,
}

/// Registers the null module's methods.
pub fn register(reg: &mut Registry) {
    reg.typed(
        "bdev_null_create",
        "Creates a null bdev (writes are dropped, reads return zeroes).",
        |_, p: NullCreate| async move {
            check_no_metadata(p.md_size, p.dif_type)?;
            let _ = (p.md_interleave, p.dif_is_head_of_md, p.dif_pi_format);
            // SPDK v26.05 writes these hints for every null bdev; only their defaults mean nothing
            // (Ferrite's bdevs have no write hints; the unmap ones are reported, as SPDK does).
            for (k, v) in [
                ("preferred_write_granularity", p.preferred_write_granularity),
                ("preferred_write_alignment", p.preferred_write_alignment),
                ("optimal_write_size", p.optimal_write_size),
            ] {
                check_default(k, v, 0)?;
            }
            let b = create(NullOpts {
                name: p.name,
                num_blocks: p.num_blocks,
                block_size: p.block_size,
                physical_block_size: p.physical_block_size,
                uuid: p.uuid,
                preferred_unmap_granularity: p.preferred_unmap_granularity.unwrap_or(0),
                preferred_unmap_alignment: p.preferred_unmap_alignment.unwrap_or(0),
            })
            .map_err(bdev_err)?;
            Ok(json!(b.name()))
        },
    );
    reg.typed("bdev_null_resize", "Resizes a null bdev.", |_, p: NullResize| async move {
        super::resize(&p.name, p.new_size).map_err(bdev_err)?;
        Ok(json!(true))
    });
    reg.typed("bdev_null_delete", "Deletes a null bdev.", |_, p: NameParam| async move { delete(p, "null").await });
}
