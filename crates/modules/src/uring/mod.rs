//! The uring bdev: a file or block device served through each reactor's io_uring. It also
//! serves SPDK's `bdev_aio_create` (the method most SPDK configs use for files), under the
//! module name "aio".
//!
//! Opened with O_DIRECT where the file system allows it (buffered otherwise, logged). Each core's
//! channel installs the descriptor in its ring's fixed file table and uses fixed buffers for
//! single-segment payloads that have a fixed index (pooled buffers, and views of external memory
//! registered with `ferrite_reactor::FixedMem`), so a 4 KiB read costs one SQE and no syscall of its own: submissions are
//! batched once per reactor loop turn. The request itself is the SQE's `user_data` (no table
//! keyed by tag); iovec arrays of up to four segments live in the request's module context.

pub mod rpc;

use ferrite_bdev::bdev::{register, BackendChannel, Bdev, BdevBackend, BdevError, BdevProps, Limits};
use ferrite_bdev::io::{BdevIo, IoStatus, IoType, IoTypes, MODULE_CTX_BYTES};
use ferrite_reactor::ring::{uring_opcode as op, uring_types as types, CqeHandler, SqEntry};
use serde_json::{json, Value};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::rc::Rc;
use std::sync::Arc;

/// Which SPDK module's interface a bdev was created through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Flavor {
    /// `bdev_uring_create`.
    #[default]
    Uring,
    /// `bdev_aio_create`.
    Aio,
}

/// Parameters of `bdev_uring_create` and `bdev_aio_create`.
#[derive(Debug, Clone, Default)]
pub struct UringOpts {
    /// Name.
    pub name: String,
    /// Path of the file or block device.
    pub filename: String,
    /// Bytes per block (None or 0: the device's logical block size, 512 for files).
    pub block_size: Option<u32>,
    /// UUID (random if None).
    pub uuid: Option<String>,
    /// Open read-only (aio's `readonly`).
    pub readonly: bool,
    /// Unmap and write zeroes by fallocate (aio's `fallocate`; uring always does).
    pub fallocate: bool,
    /// The interface it was created through.
    pub flavor: Flavor,
}

/// I/O types served, before read-only and fallocate options take some away.
const IO_TYPES: IoTypes =
    IoTypes::of(&[IoType::Read, IoType::Write, IoType::Flush, IoType::Unmap, IoType::WriteZeroes, IoType::Reset]);

/// Segments whose iovecs fit in the module context.
const INLINE_IOVECS: usize = MODULE_CTX_BYTES / std::mem::size_of::<libc::iovec>();

struct UringBackend {
    file: Arc<File>,
    opts: UringOpts,
    block_device: bool,
    direct: bool,
}

impl BdevBackend for UringBackend {
    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    fn create_channel(&self) -> Result<Box<dyn BackendChannel>, BdevError> {
        let fd = self.file.as_raw_fd();
        let fixed = ferrite_reactor::try_with_ring(|r| r.install_file(fd)).flatten();
        Ok(Box::new(UringChannel {
            state: Rc::new(UringState { file: self.file.clone(), fixed, block_device: self.block_device }),
        }))
    }

    fn driver_specific(&self) -> Value {
        match self.opts.flavor {
            Flavor::Uring => json!({"uring": {"filename": self.opts.filename, "o_direct": self.direct}}),
            Flavor::Aio => json!({"aio": {"filename": self.opts.filename,
                "block_size_override": self.opts.block_size.unwrap_or(0) != 0,
                "readonly": self.opts.readonly, "fallocate": self.opts.fallocate}}),
        }
    }

    fn config_entry(&self, bdev: &Bdev) -> Option<Value> {
        // Only keys SPDK v26.05's methods accept (its bdev_uring_create takes a uuid; SPDK
        // releases before v24.05 do not, and refuse this entry).
        Some(match self.opts.flavor {
            Flavor::Uring => json!({"method": "bdev_uring_create", "params": {
                "name": bdev.name(), "filename": self.opts.filename, "block_size": bdev.block_size(),
                "uuid": bdev.uuid().to_string()}}),
            Flavor::Aio => json!({"method": "bdev_aio_create", "params": {
                "name": bdev.name(), "filename": self.opts.filename, "block_size": bdev.block_size(),
                "readonly": self.opts.readonly, "fallocate": self.opts.fallocate,
                "uuid": bdev.uuid().to_string()}}),
        })
    }
}

struct UringState {
    file: Arc<File>,
    fixed: Option<u32>,
    block_device: bool,
}

struct UringChannel {
    state: Rc<UringState>,
}

impl Drop for UringChannel {
    fn drop(&mut self) {
        if let Some(slot) = self.state.fixed {
            ferrite_reactor::try_with_ring(|r| r.remove_file(slot));
        }
    }
}

macro_rules! with_target {
    ($state:expr, |$t:ident| $body:expr) => {
        match $state.fixed {
            Some(i) => {
                let $t = types::Fixed(i);
                $body
            }
            None => {
                let $t = types::Fd($state.file.as_raw_fd());
                $body
            }
        }
    };
}

/// A request's iovec array, in its module context (up to four segments).
#[derive(Clone, Copy)]
struct InlineIovecs([libc::iovec; INLINE_IOVECS]);

/// A request's iovec array on the heap (more than four segments), made by `iovecs`.
#[derive(Clone, Copy)]
struct SpilledIovecs(*mut libc::iovec);

/// Where a request's iovec array is: its module context, or (more than four segments) a heap
/// array whose pointer the context holds.
fn iovecs(io: &mut BdevIo) -> (*const libc::iovec, u32) {
    let n = io.req.bufs.len();
    let iov = |b: &ferrite_reactor::IoBuf| libc::iovec { iov_base: b.as_ptr() as *mut _, iov_len: b.len() };
    if n <= INLINE_IOVECS {
        let mut arr = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; INLINE_IOVECS];
        for (slot, b) in arr.iter_mut().zip(io.req.bufs.iter()) {
            *slot = iov(b);
        }
        io.set_ctx(InlineIovecs(arr));
        let arr = io.ctx::<InlineIovecs>().expect("just set");
        return (arr.0.as_ptr(), n as u32);
    }
    // Counted cost: one allocation per request of more than four segments.
    let v: Box<[libc::iovec]> = io.req.bufs.iter().map(iov).collect();
    let boxed = Box::into_raw(v) as *mut libc::iovec;
    io.set_ctx(SpilledIovecs(boxed));
    (boxed as *const libc::iovec, n as u32)
}

fn free_iovecs(io: &mut BdevIo) {
    let n = io.req.bufs.len();
    if let Some(&SpilledIovecs(p)) = io.ctx::<SpilledIovecs>() {
        // SAFETY: made by `iovecs` with Box::into_raw of a boxed slice of n iovecs (the
        // request's segments do not change while the module has it); freed once, the context
        // is emptied right after.
        drop(unsafe { Box::from_raw(std::ptr::slice_from_raw_parts_mut(p, n)) });
        io.set_ctx(());
    }
}

impl BackendChannel for UringChannel {
    fn submit(&mut self, mut io: BdevIo) {
        let this = &self.state;
        let off = io.offset_bytes();
        let len = io.len_bytes();
        let entry: SqEntry = match io.req.io_type {
            IoType::Read | IoType::Write if io.req.bufs.len() == 1 => {
                let write = io.req.io_type == IoType::Write;
                let b = &mut io.req.bufs[0];
                let (n, fixed) = (b.len() as u32, b.fixed_index());
                // Writes only read the buffer, which may be lent read-only memory.
                let ptr = if write { b.as_ptr() as *mut u8 } else { b.as_mut_ptr() };
                with_target!(this, |t| match (write, fixed) {
                    (false, Some(i)) => op::ReadFixed::new(t, ptr, n, i).offset(off).build(),
                    (false, None) => op::Read::new(t, ptr, n).offset(off).build(),
                    (true, Some(i)) => op::WriteFixed::new(t, ptr, n, i).offset(off).build(),
                    (true, None) => op::Write::new(t, ptr, n).offset(off).build(),
                })
            }
            IoType::Read | IoType::Write => {
                let write = io.req.io_type == IoType::Write;
                let (p, n) = iovecs(&mut io);
                with_target!(this, |t| if write {
                    op::Writev::new(t, p, n).offset(off).build()
                } else {
                    op::Readv::new(t, p, n).offset(off).build()
                })
            }
            IoType::Flush => with_target!(this, |t| op::Fsync::new(t).build()),
            IoType::Unmap | IoType::WriteZeroes => {
                let zero = io.req.io_type == IoType::WriteZeroes && this.block_device;
                let mode = libc::FALLOC_FL_KEEP_SIZE
                    | if zero { libc::FALLOC_FL_ZERO_RANGE } else { libc::FALLOC_FL_PUNCH_HOLE };
                with_target!(this, |t| op::Fallocate::new(t, len).offset(off).mode(mode).build())
            }
            // A reset reaches the module once earlier requests have completed: nothing to do.
            _ => {
                io.complete_deferred(IoStatus::Success);
                return;
            }
        };
        let handler: Rc<dyn CqeHandler> = this.clone();
        let raw = io.into_raw();
        // Regular files: O_DIRECT on many file systems (tmpfs among them) is completed by io-wq
        // workers; block devices complete asynchronously from the device.
        let worker = !this.block_device;
        // SAFETY: the entry's buffers and iovec array belong to the request behind `raw` (its
        // segments and module context, which a boxed request keeps at a fixed address), which
        // `complete` takes back only when this entry completes; the file outlives the channel.
        let pushed = ferrite_reactor::try_with_ring(|r| unsafe {
            if worker {
                r.push_worker_bound(entry, handler, raw)
            } else {
                r.push(entry, handler, raw)
            }
        });
        if !matches!(pushed, Some(Ok(()))) {
            // SAFETY: the entry was not queued, so `raw` is still ours.
            let mut io = unsafe { BdevIo::from_raw(raw) };
            free_iovecs(&mut io);
            // Ring full: the bdev layer retries when something completes (or after a moment
            // if nothing of this channel is in flight). No ring: not on a reactor.
            let status = if pushed.is_some() { IoStatus::NoMem } else { IoStatus::Failed(libc::ENXIO) };
            io.complete_deferred(status);
        }
    }
}

impl CqeHandler for UringState {
    fn complete(&self, tag: u64, result: i32) {
        // SAFETY: every entry this handler gets was pushed with a request given up by into_raw.
        let mut io = unsafe { BdevIo::from_raw(tag) };
        free_iovecs(&mut io);
        let status = if result < 0 {
            IoStatus::Failed(-result)
        } else if io.req.io_type.has_payload() && result as u64 != io.len_bytes() {
            log::warn!("uring: short {:?} of {} bytes (wanted {})", io.req.io_type, result, io.len_bytes());
            IoStatus::Failed(libc::EIO)
        } else {
            IoStatus::Success
        };
        io.complete(status);
    }
}

/// An open failure, answered with its errno as SPDK's aio and uring modules answer (-ENOENT for
/// a missing file, -EACCES, ...).
fn open_error(path: &str, e: std::io::Error) -> BdevError {
    BdevError::Errno(e.raw_os_error().unwrap_or(libc::EIO), format!("cannot open {path}: {e}"))
}

fn open(path: &str, readonly: bool) -> Result<(File, bool), BdevError> {
    let mut o = std::fs::OpenOptions::new();
    o.read(true).write(!readonly);
    match o.clone().custom_flags(libc::O_DIRECT).open(path) {
        Ok(f) => Ok((f, true)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            log::warn!("{path}: O_DIRECT not supported by its file system; using buffered I/O");
            o.open(path).map(|f| (f, false)).map_err(|e| open_error(path, e))
        }
        Err(e) => Err(open_error(path, e)),
    }
}

fn block_device_geometry(f: &File) -> Result<(u64, u32), BdevError> {
    const BLKSSZGET: libc::c_ulong = 0x1268;
    const BLKGETSIZE64: libc::c_ulong = 0x80081272;
    let (mut size, mut lbs): (u64, libc::c_int) = (0, 0);
    // SAFETY: both ioctls write one integer of the given type through a valid pointer.
    let ok = unsafe {
        libc::ioctl(f.as_raw_fd(), BLKGETSIZE64, &mut size) == 0 && libc::ioctl(f.as_raw_fd(), BLKSSZGET, &mut lbs) == 0
    };
    if !ok {
        return Err(BdevError::Os(format!("cannot read block device size: {}", std::io::Error::last_os_error())));
    }
    Ok((size, lbs as u32))
}

/// Size in bytes of an open file or block device.
fn size_of(f: &File, block_device: bool) -> Result<u64, BdevError> {
    if block_device {
        return block_device_geometry(f).map(|(size, _)| size);
    }
    f.metadata().map(|m| m.len()).map_err(|e| BdevError::Os(format!("cannot read the file size: {e}")))
}

/// Re-reads the size of a uring or aio bdev's file or device and resizes the bdev to it (SPDK's
/// `bdev_uring_rescan` and `bdev_aio_rescan`). Reads file metadata: call it off the reactors.
pub fn rescan(name: &str, module: &str) -> Result<u64, BdevError> {
    let b = ferrite_bdev::bdev::lookup(name)
        .filter(|b| b.module() == module)
        .ok_or_else(|| BdevError::NotFound(name.into()))?;
    let backend =
        b.backend().as_any().and_then(|a| a.downcast_ref::<UringBackend>()).expect("a uring module's backend");
    let blocks = size_of(&backend.file, backend.block_device)? / b.block_size() as u64;
    if blocks != b.num_blocks() {
        b.notify_resize(blocks)?;
    }
    Ok(blocks)
}

/// Creates a uring (or aio) bdev over an existing file or block device. Opens the file and
/// reads its geometry, which may block: call it off the reactors (the RPCs do).
pub fn create(opts: UringOpts) -> Result<Bdev, BdevError> {
    ferrite_bdev::bdev::check_name(&opts.name)?;
    if ferrite_bdev::bdev::lookup(&opts.name).is_some() {
        return Err(BdevError::Exists(opts.name));
    }
    let (file, direct) = open(&opts.filename, opts.readonly)?;
    let meta = file.metadata().map_err(|e| BdevError::Os(format!("{}: {e}", opts.filename)))?;
    let block_device = meta.file_type().is_block_device();
    if !block_device && !meta.file_type().is_file() {
        return Err(BdevError::Invalid(format!("{} is neither a regular file nor a block device", opts.filename)));
    }
    let (size, native_bs) = if block_device { block_device_geometry(&file)? } else { (meta.len(), 512) };
    let block_size = match opts.block_size {
        None | Some(0) => native_bs,
        Some(bs) if bs < native_bs => {
            return Err(BdevError::Invalid(format!(
                "block_size {bs} is smaller than the device's logical block size {native_bs}"
            )))
        }
        Some(bs) => bs,
    };
    let num_blocks = size / block_size as u64;
    if num_blocks == 0 {
        return Err(BdevError::Invalid(format!("{} is smaller than one block of {block_size} bytes", opts.filename)));
    }
    let mut io_types = IO_TYPES;
    if opts.readonly {
        io_types = io_types.without(IoType::Write).without(IoType::Unmap).without(IoType::WriteZeroes);
    }
    if opts.flavor == Flavor::Aio && !opts.fallocate {
        io_types = io_types.without(IoType::Unmap).without(IoType::WriteZeroes);
    }
    let limits = Limits {
        // O_DIRECT needs every segment's address and length aligned to the device's logical
        // block size.
        buf_align: if direct { native_bs } else { 1 },
        seg_len_align: if direct { native_bs } else { 1 },
        max_segments: 1024,
        write_cache: true,
        ..Limits::default()
    };
    let (module, product_name) = match opts.flavor {
        Flavor::Uring => ("uring", "URING bdev"),
        Flavor::Aio => ("aio", "AIO disk"),
    };
    let props = BdevProps {
        name: opts.name.clone(),
        aliases: vec![],
        uuid: super::parse_uuid(opts.uuid.as_deref())?,
        block_size,
        num_blocks,
        product_name,
        module,
        io_types,
        limits,
    };
    register(props, Arc::new(UringBackend { file: Arc::new(file), opts, block_device, direct }))
}
