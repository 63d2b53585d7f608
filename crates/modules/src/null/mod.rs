//! The null bdev: discards writes, reads zeroes. For testing upper layers and measuring the
//! stack's own overhead. Serves what SPDK's null bdev serves: read, write, write zeroes and
//! reset (flush and unmap are refused, as in SPDK).
//!
//! A zero-copy read (a target's: NVMe/TCP, NBD) is lent a view of one read-only mapping of
//! zeroes that every channel shares, so it takes no buffer and zeroes nothing; a read into the
//! caller's own buffers zeroes them. (SPDK's null bdev hands a read a pool buffer as it is,
//! whatever it last held.)

pub mod rpc;

use ferrite_bdev::bdev::{register, BackendChannel, Bdev, BdevBackend, BdevError, BdevProps, Limits};
use ferrite_bdev::io::{BdevIo, IoStatus, IoType, IoTypes};
use ferrite_reactor::{IoBuf, Lender};
use serde_json::{json, Value};
use std::ptr::NonNull;
use std::rc::Rc;
use std::sync::{Arc, OnceLock};

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
    /// Preferred unmap granularity in blocks, reported to users of the bdev (0: none; SPDK's
    /// `preferred_unmap_granularity`; the null bdev has no unmap, as SPDK's).
    pub preferred_unmap_granularity: u32,
    /// Preferred unmap alignment in blocks (SPDK's `preferred_unmap_alignment`).
    pub preferred_unmap_alignment: u32,
}

/// The I/O types the null module serves.
pub const IO_TYPES: IoTypes = IoTypes::of(&[IoType::Read, IoType::Write, IoType::WriteZeroes, IoType::Reset]);

struct NullBackend {
    physical_block_size: Option<u32>,
}

/// Bytes of the shared mapping of zeroes; a longer zero-copy read is lent several views of it.
const ZEROES_LEN: usize = 1 << 20;

/// The process's read-only mapping of zeroes (anonymous and never written: every page of it is
/// the kernel's zero page, so it costs no memory). Never unmapped.
fn zeroes() -> Option<NonNull<u8>> {
    static ZEROES: OnceLock<usize> = OnceLock::new();
    let at = *ZEROES.get_or_init(|| {
        // SAFETY: a fresh anonymous private read-only mapping; the result is checked.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                ZEROES_LEN,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            0
        } else {
            p as usize
        }
    });
    NonNull::new(at as *mut u8)
}

struct NullChannel {
    /// The shared zeroes and this core's handle for lending them (None: the mapping failed,
    /// and zero-copy reads get pool buffers from the bdev layer instead).
    zeroes: Option<(NonNull<u8>, Rc<Lender>)>,
}

impl BackendChannel for NullChannel {
    fn lends_reads(&self) -> bool {
        self.zeroes.is_some()
    }

    #[inline]
    fn submit(&mut self, mut io: BdevIo) {
        if io.req.io_type == IoType::Read {
            if io.req.is_zcopy_read() {
                let (at, lender) = self.zeroes.as_ref().expect("lends only with the mapping");
                let mut left = io.len_bytes() as usize;
                while left > 0 {
                    let n = left.min(ZEROES_LEN);
                    // SAFETY: the mapping holds ZEROES_LEN readable bytes and is never unmapped.
                    io.req.bufs.push(unsafe { IoBuf::lent(*at, n, lender.clone()) });
                    left -= n;
                }
            } else {
                for b in io.req.bufs.iter_mut() {
                    b.zero();
                }
            }
        }
        io.complete_deferred(IoStatus::Success);
    }
}

impl BdevBackend for NullBackend {
    fn create_channel(&self) -> Result<Box<dyn BackendChannel>, BdevError> {
        Ok(Box::new(NullChannel { zeroes: zeroes().map(|at| (at, Rc::new(Lender::new(())))) }))
    }

    fn zcopy(&self) -> bool {
        zeroes().is_some()
    }

    fn config_entry(&self, bdev: &Bdev) -> Option<Value> {
        let mut params = json!({"name": bdev.name(), "num_blocks": bdev.num_blocks(),
            "block_size": bdev.block_size(), "uuid": bdev.uuid().to_string()});
        if let Some(p) = self.physical_block_size {
            params["physical_block_size"] = json!(p);
        }
        let l = bdev.limits();
        if l.unmap_granularity != 0 || l.unmap_alignment != 0 {
            params["preferred_unmap_granularity"] = json!(l.unmap_granularity);
            params["preferred_unmap_alignment"] = json!(l.unmap_alignment);
        }
        Some(json!({"method": "bdev_null_create", "params": params}))
    }
}

/// Changes a null bdev's size to `new_size_mib` MiB (SPDK's `bdev_null_resize`; it may only grow
/// while the bdev is open).
pub fn resize(name: &str, new_size_mib: u64) -> Result<(), BdevError> {
    let b = ferrite_bdev::bdev::lookup(name)
        .filter(|b| b.module() == "null")
        .ok_or_else(|| BdevError::NotFound(name.into()))?;
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
        limits: Limits {
            physical_block_size: opts.physical_block_size.unwrap_or(0),
            unmap_granularity: opts.preferred_unmap_granularity,
            unmap_alignment: opts.preferred_unmap_alignment,
            ..Limits::default()
        },
    };
    register(props, Arc::new(NullBackend { physical_block_size: opts.physical_block_size }))
}
