//! The null bdev: discards writes, reads zeroes. For testing upper layers and measuring the
//! stack's own overhead. Serves what SPDK's null bdev serves: read, write, write zeroes and
//! reset (flush and unmap are refused, as in SPDK).

pub mod rpc;

use crate::bdev::{register, BackendChannel, Bdev, BdevBackend, BdevError, BdevProps, Limits};
use crate::io::{BdevIo, IoStatus, IoType, IoTypes};
use serde_json::{json, Value};
use std::sync::Arc;

/// Parameters of `bdev_null_create`.
#[derive(Debug, Clone, Default)]
pub struct NullOpts {
    /// Name.
    pub name: String,
    /// Number of blocks.
    pub num_blocks: u64,
    /// Bytes per block.
    pub block_size: u32,
    /// Bytes per physical block (None: the block size).
    pub physical_block_size: Option<u32>,
    /// UUID (random if None).
    pub uuid: Option<String>,
}

/// The I/O types the null module serves.
pub const IO_TYPES: IoTypes = IoTypes::of(&[IoType::Read, IoType::Write, IoType::WriteZeroes, IoType::Reset]);

struct NullBackend {
    physical_block_size: Option<u32>,
}

struct NullChannel;

impl BackendChannel for NullChannel {
    #[inline]
    fn submit(&mut self, mut io: BdevIo) {
        if io.req.io_type == IoType::Read {
            for b in io.req.bufs.iter_mut() {
                b.zero();
            }
        }
        io.complete_deferred(IoStatus::Success);
    }
}

impl BdevBackend for NullBackend {
    fn create_channel(&self) -> Result<Box<dyn BackendChannel>, BdevError> {
        Ok(Box::new(NullChannel))
    }

    fn config_entry(&self, bdev: &Bdev) -> Option<Value> {
        let mut params = json!({"name": bdev.name(), "num_blocks": bdev.num_blocks(),
            "block_size": bdev.block_size(), "uuid": bdev.uuid().to_string()});
        if let Some(p) = self.physical_block_size {
            params["physical_block_size"] = json!(p);
        }
        Some(json!({"method": "bdev_null_create", "params": params}))
    }
}

/// Changes a null bdev's size to `new_size_mib` MiB (SPDK's `bdev_null_resize`; it may only grow
/// while the bdev is open).
pub fn resize(name: &str, new_size_mib: u64) -> Result<(), BdevError> {
    let b =
        crate::bdev::lookup(name).filter(|b| b.module() == "null").ok_or_else(|| BdevError::NotFound(name.into()))?;
    let bytes = new_size_mib
        .checked_mul(1 << 20)
        .ok_or_else(|| BdevError::Invalid(format!("new_size {new_size_mib} MiB is too large")))?;
    if bytes % b.block_size() as u64 != 0 {
        return Err(BdevError::Invalid(format!(
            "new_size {new_size_mib} MiB is not a multiple of the block size {}",
            b.block_size()
        )));
    }
    b.notify_resize(bytes / b.block_size() as u64)
}

/// Creates a null bdev.
pub fn create(opts: NullOpts) -> Result<Bdev, BdevError> {
    let props = BdevProps {
        name: opts.name,
        aliases: vec![],
        uuid: super::parse_uuid(opts.uuid.as_deref())?,
        block_size: opts.block_size,
        num_blocks: opts.num_blocks,
        product_name: "Null disk",
        module: "null",
        io_types: IO_TYPES,
        limits: Limits { physical_block_size: opts.physical_block_size.unwrap_or(0), ..Limits::default() },
    };
    register(props, Arc::new(NullBackend { physical_block_size: opts.physical_block_size }))
}
