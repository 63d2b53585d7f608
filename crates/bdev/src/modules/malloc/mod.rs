//! The malloc bdev: a RAM disk in an anonymous mapping (pages are only touched when written).
//!
//! The memory is shared by every core's channel and accessed with plain copies, as SPDK does:
//! two cores writing the same blocks at the same time get one of the two payloads per block
//! range, like concurrent writers on a real disk.

use crate::bdev::{check_geometry, register, BackendChannel, Bdev, BdevBackend, BdevError, BdevProps};
use crate::io::{BdevIo, IoStatus, IoType, IoTypes};
use ferrite_reactor::{IoBuf, Lender};
use serde_json::{json, Value};
use std::rc::Rc;
use std::sync::Arc;

/// Parameters of `bdev_malloc_create`.
#[derive(Debug, Clone)]
pub struct MallocOpts {
    /// Name (None: the first free `MallocN`).
    pub name: Option<String>,
    /// Number of blocks.
    pub num_blocks: u64,
    /// Bytes per block.
    pub block_size: u32,
    /// UUID (random if None).
    pub uuid: Option<String>,
}

struct Memory {
    base: *mut u8,
    len: usize,
}

// SAFETY: the mapping is valid for the life of Memory and only accessed through raw copies
// bounded by `len` (checked by the bdev layer's range check).
unsafe impl Send for Memory {}
// SAFETY: as above; concurrent copies into the same bytes are the documented disk-like race.
unsafe impl Sync for Memory {}

impl Drop for Memory {
    fn drop(&mut self) {
        // SAFETY: unmaps the mapping made in `create`; no channel outlives the backend.
        unsafe { libc::munmap(self.base as *mut _, self.len) };
    }
}

struct MallocBackend {
    mem: Arc<Memory>,
}

struct MallocChannel {
    mem: Arc<Memory>,
    /// This core's share of `mem` for lent read buffers: cloning an `Rc` per zero-copy read
    /// touches no counter that other cores write.
    lender: Rc<Lender>,
}

impl BackendChannel for MallocChannel {
    fn lends_reads(&self) -> bool {
        true
    }

    #[inline]
    fn submit(&mut self, mut io: BdevIo) {
        let off = io.offset_bytes() as usize;
        let len = io.len_bytes() as usize;
        debug_assert!(off + len <= self.mem.len, "bdev layer range check missed");
        if io.req.is_zcopy_read() {
            // SAFETY: [off, off+len) lies within the mapping, which the lender keeps mapped.
            let buf = unsafe {
                let ptr = std::ptr::NonNull::new(self.mem.base.add(off)).expect("mapping is non-null");
                IoBuf::lent(ptr, len, self.lender.clone())
            };
            io.req.bufs.push(buf);
            io.complete_deferred(IoStatus::Success);
            return;
        }
        // SAFETY: [off, off+len) lies within the mapping (range checked by the bdev layer), and
        // buffers are disjoint from it.
        unsafe {
            let base = self.mem.base.add(off);
            match io.req.io_type {
                IoType::Read => {
                    let mut pos = 0;
                    for b in io.req.bufs.iter_mut() {
                        std::ptr::copy_nonoverlapping(base.add(pos), b.as_mut_ptr(), b.len());
                        pos += b.len();
                    }
                }
                IoType::Write => {
                    let mut pos = 0;
                    for b in io.req.bufs.iter() {
                        std::ptr::copy_nonoverlapping(b.as_ptr(), base.add(pos), b.len());
                        pos += b.len();
                    }
                }
                IoType::Unmap | IoType::WriteZeroes => std::ptr::write_bytes(base, 0, len),
                // Resets are handled by the bdev layer and never arrive here.
                IoType::Flush | IoType::Reset => {}
            }
        }
        io.complete_deferred(IoStatus::Success);
    }
}

impl BdevBackend for MallocBackend {
    fn create_channel(&self) -> Result<Box<dyn BackendChannel>, BdevError> {
        Ok(Box::new(MallocChannel { mem: self.mem.clone(), lender: Rc::new(Lender::new(self.mem.clone())) }))
    }

    fn config_entry(&self, bdev: &Bdev) -> Option<Value> {
        Some(json!({"method": "bdev_malloc_create", "params": {
            "name": bdev.name(), "num_blocks": bdev.num_blocks(), "block_size": bdev.block_size(),
            "uuid": bdev.uuid().to_string()}}))
    }
}

/// Creates a malloc bdev.
pub fn create(opts: MallocOpts) -> Result<Bdev, BdevError> {
    check_geometry(opts.block_size, opts.num_blocks)?;
    let len = usize::try_from(opts.num_blocks * opts.block_size as u64)
        .map_err(|_| BdevError::Invalid("malloc bdev too large".into()))?;
    // SAFETY: an anonymous private mapping; the result is checked. MAP_NORESERVE lets a large
    // RAM disk exist before it is written.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(BdevError::Os(format!("cannot map {len} bytes: {}", std::io::Error::last_os_error())));
    }
    let mem = Arc::new(Memory { base: p as *mut u8, len });
    let props = BdevProps {
        name: opts.name.unwrap_or_else(|| super::next_free_name("Malloc")),
        aliases: vec![],
        uuid: super::parse_uuid(opts.uuid.as_deref())?,
        block_size: opts.block_size,
        num_blocks: opts.num_blocks,
        product_name: "Malloc disk",
        module: "malloc",
        io_types: IoTypes::of(&IoType::ALL),
    };
    register(props, Arc::new(MallocBackend { mem }))
}
