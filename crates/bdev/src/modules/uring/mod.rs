//! The uring bdev: a file or block device served through each reactor's io_uring.
//!
//! Opened with O_DIRECT where the file system allows it (buffered otherwise, logged). Each core's
//! channel installs the descriptor in its ring's fixed file table and uses fixed buffers for
//! pooled payloads, so a 4 KiB read costs one SQE and no syscall of its own: submissions are
//! batched once per reactor loop turn.

use crate::bdev::{register, BackendChannel, Bdev, BdevBackend, BdevError, BdevProps};
use crate::io::{BdevIo, IoStatus, IoType, IoTypes};
use ferrite_reactor::ring::{uring_opcode as op, uring_types as types, CqeHandler, SqEntry};
use serde_json::{json, Value};
use std::cell::RefCell;
use std::collections::VecDeque;
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::rc::Rc;
use std::sync::Arc;

/// Parameters of `bdev_uring_create`.
#[derive(Debug, Clone)]
pub struct UringOpts {
    /// Name.
    pub name: String,
    /// Path of the file or block device.
    pub filename: String,
    /// Bytes per block (None or 0: the device's logical block size, 512 for files).
    pub block_size: Option<u32>,
    /// UUID (random if None).
    pub uuid: Option<String>,
}

struct UringBackend {
    file: Arc<File>,
    filename: String,
    block_device: bool,
    direct: bool,
}

impl BdevBackend for UringBackend {
    fn create_channel(&self) -> Result<Box<dyn BackendChannel>, BdevError> {
        let fd = self.file.as_raw_fd();
        let fixed = ferrite_reactor::try_with_ring(|r| r.install_file(fd)).flatten();
        Ok(Box::new(UringChannel {
            state: Rc::new_cyclic(|me| UringState {
                me: me.clone(),
                file: self.file.clone(),
                fixed,
                block_device: self.block_device,
                slots: RefCell::new(Slots::default()),
                waiting: RefCell::new(VecDeque::new()),
            }),
        }))
    }

    fn driver_specific(&self) -> Value {
        json!({"uring": {"filename": self.filename, "o_direct": self.direct}})
    }

    fn config_entry(&self, bdev: &Bdev) -> Option<Value> {
        Some(json!({"method": "bdev_uring_create", "params": {
            "name": bdev.name(), "filename": self.filename, "block_size": bdev.block_size(),
            "uuid": bdev.uuid().to_string()}}))
    }
}

#[derive(Default)]
struct Slots {
    ios: Vec<Option<BdevIo>>,
    iovecs: Vec<Vec<libc::iovec>>,
    free: Vec<u32>,
}

struct UringState {
    me: std::rc::Weak<UringState>,
    file: Arc<File>,
    fixed: Option<u32>,
    block_device: bool,
    slots: RefCell<Slots>,
    waiting: RefCell<VecDeque<BdevIo>>,
}

struct UringChannel {
    state: Rc<UringState>,
}

impl BackendChannel for UringChannel {
    fn submit(&mut self, io: BdevIo) {
        if !self.state.waiting.borrow().is_empty() {
            self.state.waiting.borrow_mut().push_back(io);
            return;
        }
        if let Err(io) = UringState::start(&self.state, io) {
            self.state.waiting.borrow_mut().push_back(io);
        }
    }
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

impl UringState {
    /// Queues `io` on the ring; gives it back if the ring is full.
    fn start(this: &Rc<Self>, mut io: BdevIo) -> Result<(), BdevIo> {
        let off = io.offset_bytes();
        let len = io.len_bytes();
        let mut slots = this.slots.borrow_mut();
        let slot = match slots.free.pop() {
            Some(s) => s,
            None => {
                slots.ios.push(None);
                slots.iovecs.push(Vec::new());
                (slots.ios.len() - 1) as u32
            }
        };
        let entry: SqEntry = match io.req.io_type {
            IoType::Read | IoType::Write if io.req.bufs.len() == 1 => {
                let b = &mut io.req.bufs[0];
                let (ptr, n, fixed) = (b.as_mut_ptr(), b.len() as u32, b.fixed_index());
                let write = io.req.io_type == IoType::Write;
                with_target!(this, |t| match (write, fixed) {
                    (false, Some(i)) => op::ReadFixed::new(t, ptr, n, i).offset(off).build(),
                    (false, None) => op::Read::new(t, ptr, n).offset(off).build(),
                    (true, Some(i)) => op::WriteFixed::new(t, ptr, n, i).offset(off).build(),
                    (true, None) => op::Write::new(t, ptr, n).offset(off).build(),
                })
            }
            IoType::Read | IoType::Write => {
                let iov = &mut slots.iovecs[slot as usize];
                iov.clear();
                for b in io.req.bufs.iter_mut() {
                    iov.push(libc::iovec { iov_base: b.as_mut_ptr() as *mut _, iov_len: b.len() });
                }
                let (p, n) = (iov.as_ptr(), iov.len() as u32);
                let write = io.req.io_type == IoType::Write;
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
            // Resets are handled by the bdev layer and never arrive here.
            IoType::Reset => {
                slots.free.push(slot);
                drop(slots);
                io.complete_deferred(IoStatus::Success);
                return Ok(());
            }
        };
        slots.ios[slot as usize] = Some(io);
        drop(slots);
        let handler: Rc<dyn CqeHandler> = this.clone();
        // SAFETY: the entry's buffers (and iovec array) belong to the BdevIo stored in `slot`,
        // which stays there until `complete` runs for this tag; the file outlives the channel.
        // Regular files: O_DIRECT on many file systems (tmpfs among them) is completed by io-wq
        // workers; block devices complete asynchronously from the device.
        let worker = !this.block_device;
        let pushed = ferrite_reactor::try_with_ring(|r| unsafe {
            if worker {
                r.push_worker_bound(entry, handler, slot as u64)
            } else {
                r.push(entry, handler, slot as u64)
            }
        });
        match pushed {
            Some(Ok(())) => Ok(()),
            _ => {
                let mut slots = this.slots.borrow_mut();
                let io = slots.ios[slot as usize].take().expect("slot just filled");
                slots.free.push(slot);
                Err(io)
            }
        }
    }
}

impl CqeHandler for UringState {
    fn complete(&self, tag: u64, result: i32) {
        let io = {
            let mut slots = self.slots.borrow_mut();
            slots.free.push(tag as u32);
            slots.ios[tag as usize].take().expect("completion for an idle uring slot")
        };
        let status = if result < 0 {
            IoStatus::Failed(-result)
        } else if io.req.io_type.has_payload() && result as u64 != io.len_bytes() {
            log::warn!("uring: short {:?} of {} bytes (wanted {})", io.req.io_type, result, io.len_bytes());
            IoStatus::Failed(libc::EIO)
        } else {
            IoStatus::Success
        };
        io.complete(status);
        self.retry_waiting();
    }
}

impl UringState {
    /// Starts requests that found the ring full, now that an entry completed.
    fn retry_waiting(&self) {
        let Some(me) = self.me.upgrade() else { return };
        loop {
            let Some(io) = self.waiting.borrow_mut().pop_front() else { return };
            if let Err(io) = Self::start(&me, io) {
                self.waiting.borrow_mut().push_front(io);
                return;
            }
        }
    }
}

fn open(path: &str) -> Result<(File, bool), BdevError> {
    let mut o = std::fs::OpenOptions::new();
    o.read(true).write(true);
    match o.clone().custom_flags(libc::O_DIRECT).open(path) {
        Ok(f) => Ok((f, true)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            log::warn!("{path}: O_DIRECT not supported by its file system; using buffered I/O");
            o.open(path).map(|f| (f, false)).map_err(|e| BdevError::Os(format!("cannot open {path}: {e}")))
        }
        Err(e) => Err(BdevError::Os(format!("cannot open {path}: {e}"))),
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

/// Creates a uring bdev over an existing file or block device.
pub fn create(opts: UringOpts) -> Result<Bdev, BdevError> {
    let (file, direct) = open(&opts.filename)?;
    let meta = file.metadata().map_err(|e| BdevError::Os(format!("{}: {e}", opts.filename)))?;
    let block_device = meta.file_type().is_block_device();
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
    let props = BdevProps {
        name: opts.name,
        aliases: vec![],
        uuid: super::parse_uuid(opts.uuid.as_deref())?,
        block_size,
        num_blocks,
        product_name: "URING bdev",
        module: "uring",
        io_types: IoTypes::of(&IoType::ALL),
    };
    register(props, Arc::new(UringBackend { file: Arc::new(file), filename: opts.filename, block_device, direct }))
}
