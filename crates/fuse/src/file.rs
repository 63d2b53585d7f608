//! One FUSE-exported bdev: the filesystem whose root is the bdev as a regular file.
//!
//! fuser runs the FUSE session on its own thread; each request is handed to the export's reactor
//! as a message and answered from there when the bdev I/O completes, so the session thread never
//! blocks on I/O. Byte ranges that are not block aligned are read-modify-written; every write,
//! unmap and write-zeroes holds its blocks in a [`RangeLock`] while it runs, so no write lands
//! between the read and the write-back of a read-modify-write of the same block.

use crate::range_lock::RangeLock;
use ferrite_bdev::{Bdev, BdevDesc, IoChannel, IoRequest, IoStatus, IoType};
use ferrite_reactor::{alloc_buf, Engine};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, INodeNo, InitFlags, KernelConfig, OpenFlags,
    ReplyAttr, ReplyData, ReplyEmpty, ReplyOpen, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

const TTL: Duration = Duration::from_secs(1);

/// The per-reactor half of an export: its descriptor, channel and the blocks being written.
struct Local {
    _desc: BdevDesc,
    ch: IoChannel,
    writes: RangeLock,
}

ferrite_reactor::reactor_local! {
    /// This reactor's open bdevs, by export id.
    static LOCALS: RefCell<HashMap<u64, Rc<Local>>> = RefCell::new(HashMap::new());
}

/// Opens the bdev on the calling reactor for export `id`; `gone` is set when the bdev goes away.
pub(crate) fn open_local(id: u64, bdev: &str, write: bool, gone: Arc<AtomicBool>) -> Result<(), String> {
    let desc = Bdev::open(bdev, write, move || {
        gone.store(true, Ordering::SeqCst);
        LOCALS.with(|l| l.borrow_mut().remove(&id));
    })
    .map_err(|e| e.to_string())?;
    let ch = desc.channel().map_err(|e| e.to_string())?;
    let local = Rc::new(Local { _desc: desc, ch, writes: RangeLock::default() });
    LOCALS.with(|l| l.borrow_mut().insert(id, local));
    Ok(())
}

/// Closes export `id`'s descriptor on the calling reactor.
pub(crate) fn close_local(id: u64) {
    LOCALS.with(|l| l.borrow_mut().remove(&id));
}

fn local(id: u64) -> Option<Rc<Local>> {
    LOCALS.with(|l| l.borrow().get(&id).cloned())
}

/// The filesystem fuser serves for one export.
pub(crate) struct BdevFile {
    pub(crate) id: u64,
    pub(crate) engine: Engine,
    pub(crate) reactor: usize,
    pub(crate) size: u64,
    pub(crate) block_size: u64,
    pub(crate) read_only: bool,
    pub(crate) gone: Arc<AtomicBool>,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
}

fn errno(s: IoStatus) -> Errno {
    match s {
        IoStatus::Success => Errno::from_i32(libc::EIO),
        IoStatus::OutOfRange => Errno::from_i32(libc::ENOSPC),
        IoStatus::Misaligned => Errno::from_i32(libc::EINVAL),
        IoStatus::Unsupported => Errno::from_i32(libc::EOPNOTSUPP),
        IoStatus::Removed => Errno::from_i32(libc::ENODEV),
        other => Errno::from_i32(other.errno()),
    }
}

/// A FUSE reply that can be failed with an errno.
trait Fail: Send + 'static {
    fn fail(self, e: Errno);
}

macro_rules! impl_fail {
    ($($t:ty),*) => {$(impl Fail for $t {
        fn fail(self, e: Errno) {
            self.error(e)
        }
    })*};
}
impl_fail!(ReplyData, ReplyWrite, ReplyEmpty);

/// Reads `[off, off+len)` (block aligned) from the bdev.
async fn read_aligned(l: &Local, bs: u64, off: u64, len: u64) -> Result<ferrite_reactor::IoBuf, Errno> {
    let c = l.ch.submit_wait(IoRequest::read(off / bs, len / bs, alloc_buf(len as usize))).await;
    if !c.status.is_ok() {
        return Err(errno(c.status));
    }
    let mut c = c;
    let req = &mut c.req;
    Ok(req.bufs.pop().expect("read buffer returned"))
}

async fn write_aligned(l: &Local, bs: u64, off: u64, buf: ferrite_reactor::IoBuf) -> Result<(), Errno> {
    let n = buf.len() as u64 / bs;
    let c = l.ch.submit_wait(IoRequest::write(off / bs, n, buf)).await;
    if c.status.is_ok() {
        Ok(())
    } else {
        Err(errno(c.status))
    }
}

/// The block-aligned span `[off, end)` covers.
fn aligned_span(bs: u64, off: u64, end: u64) -> (u64, u64) {
    (off / bs * bs, end.div_ceil(bs) * bs)
}

/// Writes `data` at byte `off`, read-modify-writing unaligned edges, holding its blocks.
async fn write_bytes(l: &Local, bs: u64, off: u64, data: Vec<u8>) -> Result<(), Errno> {
    if data.is_empty() {
        return Ok(());
    }
    let (a_off, a_end) = aligned_span(bs, off, off + data.len() as u64);
    let _held = l.writes.lock(a_off, a_end).await;
    write_held(l, bs, off, &data).await
}

/// [`write_bytes`] for a caller that already holds the blocks `data` touches.
async fn write_held(l: &Local, bs: u64, off: u64, data: &[u8]) -> Result<(), Errno> {
    let end = off + data.len() as u64;
    let (a_off, a_end) = aligned_span(bs, off, end);
    let mut buf = if a_off == off && a_end == end {
        alloc_buf(data.len())
    } else {
        read_aligned(l, bs, a_off, a_end - a_off).await?
    };
    let at = (off - a_off) as usize;
    buf[at..at + data.len()].copy_from_slice(data);
    write_aligned(l, bs, a_off, buf).await
}

/// Zeroes or unmaps `[off, off+len)`, holding its blocks: whole blocks by `whole` (Unmap or
/// WriteZeroes), edges by writing zeroes.
async fn clear_range(l: &Local, bs: u64, off: u64, len: u64, whole: IoType) -> Result<(), Errno> {
    if len == 0 {
        return Ok(());
    }
    let end = off + len;
    let (a_off, a_end) = aligned_span(bs, off, end);
    let _held = l.writes.lock(a_off, a_end).await;
    let (in_off, in_end) = (off.div_ceil(bs) * bs, end / bs * bs);
    if in_off < in_end {
        let c = l.ch.submit_wait(IoRequest::no_payload(whole, in_off / bs, (in_end - in_off) / bs)).await;
        if !c.status.is_ok() {
            return Err(errno(c.status));
        }
    }
    let edges = if in_off < in_end { [(off, in_off.min(end)), (in_end.max(off), end)] } else { [(off, end), (0, 0)] };
    for (a, b) in edges {
        if a < b {
            write_held(l, bs, a, &vec![0u8; (b - a) as usize]).await?;
        }
    }
    Ok(())
}

impl BdevFile {
    fn attr(&self) -> FileAttr {
        let now = SystemTime::now();
        FileAttr {
            ino: INodeNo(1),
            size: self.size,
            blocks: self.size / 512,
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            kind: FileType::RegularFile,
            perm: if self.read_only { 0o444 } else { 0o644 },
            nlink: 1,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: self.block_size as u32,
            flags: 0,
        }
    }

    /// Runs `f` with the reply on the export's reactor; fails the reply with ENODEV if the bdev
    /// went away.
    fn on_reactor<R, F, Fut>(&self, reply: R, f: F)
    where
        R: Fail,
        F: FnOnce(Rc<Local>, R) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + 'static,
    {
        if self.gone.load(Ordering::SeqCst) {
            return reply.fail(Errno::from_i32(libc::ENODEV));
        }
        let id = self.id;
        self.engine.send(self.reactor, move || match local(id) {
            Some(l) => ferrite_reactor::spawn_local(f(l, reply)).detach(),
            None => reply.fail(Errno::from_i32(libc::ENODEV)),
        });
    }
}

impl Filesystem for BdevFile {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Asynchronous direct I/O: the kernel keeps several reads and writes of one file in
        // flight (a loop device at queue depth 16 sends 16), instead of one at a time.
        if let Err(missing) = config.add_capabilities(InitFlags::FUSE_ASYNC_DIO) {
            log::info!("fuse export {}: kernel lacks {missing:?}; direct I/O one request at a time", self.id);
        }
        Ok(())
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if ino.0 != 1 {
            return reply.error(Errno::from_i32(libc::ENOENT));
        }
        reply.attr(&TTL, &self.attr());
    }

    fn setattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        // The size is the bdev's: only a no-op truncate is accepted.
        match size {
            Some(s) if s != self.size => reply.error(Errno::from_i32(libc::EPERM)),
            _ => reply.attr(&TTL, &self.attr()),
        }
    }

    fn open(&self, _req: &Request, _ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let acc = flags.0 & libc::O_ACCMODE;
        if self.read_only && acc != libc::O_RDONLY {
            return reply.error(Errno::from_i32(libc::EROFS));
        }
        // Direct I/O: every read and write reaches the bdev, so other exports of it stay coherent.
        // Parallel direct writes: the kernel does not serialize writes on the inode; the range
        // lock orders the ones that share blocks.
        reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES);
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        let end = (offset + size as u64).min(self.size);
        if offset >= end {
            return reply.data(&[]);
        }
        let bs = self.block_size;
        let (a_off, a_end) = (offset / bs * bs, end.div_ceil(bs) * bs);
        self.on_reactor(reply, move |l, r| async move {
            match read_aligned(&l, bs, a_off, a_end - a_off).await {
                Ok(buf) => {
                    let at = (offset - a_off) as usize;
                    r.data(&buf[at..at + (end - offset) as usize]);
                }
                Err(e) => r.error(e),
            }
        });
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock: Option<fuser::LockOwner>,
        reply: ReplyWrite,
    ) {
        if self.read_only {
            return reply.error(Errno::from_i32(libc::EROFS));
        }
        if offset.checked_add(data.len() as u64).is_none_or(|e| e > self.size) {
            return reply.error(Errno::from_i32(libc::ENOSPC));
        }
        // The one copy FUSE forces: the data lives in the session's buffer.
        let data = data.to_vec();
        let n = data.len() as u32;
        let bs = self.block_size;
        self.on_reactor(reply, move |l, r| async move {
            match write_bytes(&l, bs, offset, data).await {
                Ok(()) => r.written(n),
                Err(e) => r.error(e),
            }
        });
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock: fuser::LockOwner, reply: ReplyEmpty) {
        reply.ok();
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        self.empty_op(reply, move |l| async move {
            let c = l.ch.submit_wait(IoRequest::no_payload(IoType::Flush, 0, 0)).await;
            if c.status.is_ok() {
                Ok(())
            } else {
                Err(errno(c.status))
            }
        });
    }

    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if offset.checked_add(length).is_none_or(|e| e > self.size) {
            return reply.error(Errno::from_i32(libc::ENOSPC));
        }
        let bs = self.block_size;
        let punch = mode & libc::FALLOC_FL_PUNCH_HOLE != 0;
        let zero = mode & libc::FALLOC_FL_ZERO_RANGE != 0;
        if !punch && !zero {
            // Plain allocation inside the (fixed) size: nothing to do.
            return reply.ok();
        }
        if self.read_only {
            return reply.error(Errno::from_i32(libc::EROFS));
        }
        let whole = if punch { IoType::Unmap } else { IoType::WriteZeroes };
        self.empty_op(reply, move |l| async move { clear_range(&l, bs, offset, length, whole).await });
    }
}

impl BdevFile {
    fn empty_op<F, Fut>(&self, reply: ReplyEmpty, f: F)
    where
        F: FnOnce(Rc<Local>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<(), Errno>> + 'static,
    {
        self.on_reactor(reply, move |l, r| async move {
            match f(l).await {
                Ok(()) => r.ok(),
                Err(e) => r.error(e),
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_modules::malloc::{self, MallocOpts};
    use ferrite_reactor::{EngineConfig, ReactorMode};

    const BS: u64 = 4096;

    /// Runs `f` against export `id` of a fresh one-block-aligned malloc bdev on a one-reactor
    /// engine and returns the bdev's first block afterwards.
    fn with_export<F, Fut>(id: u64, f: F) -> Vec<u8>
    where
        F: FnOnce(Rc<Local>) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + 'static,
    {
        let e = Engine::start(EngineConfig { cores: vec![0], mode: ReactorMode::Poll, ..Default::default() })
            .expect("engine starts");
        let name = format!("FuseRace{id}");
        let rx = e.run_async(0, move || async move {
            malloc::create(MallocOpts {
                name: Some(name.clone()),
                num_blocks: 4,
                block_size: BS as u32,
                uuid: None,
                ..Default::default()
            })
            .expect("malloc bdev");
            open_local(id, &name, true, Arc::new(AtomicBool::new(false))).expect("open");
            let l = local(id).expect("local half");
            f(l.clone()).await;
            let block = read_aligned(&l, BS, 0, BS).await.expect("read back").to_vec();
            close_local(id);
            block
        });
        let block = rx.wait().expect("the test task ran");
        e.stop();
        e.join();
        block
    }

    /// Starts `write_bytes` of `data` at `off` as its own task on the calling reactor.
    fn write_task(l: &Rc<Local>, off: u64, data: Vec<u8>) -> ferrite_reactor::Task<Result<(), Errno>> {
        let l = l.clone();
        ferrite_reactor::spawn_local(async move { write_bytes(&l, BS, off, data).await })
    }

    #[test]
    fn aligned_write_during_a_read_modify_write_is_not_lost() {
        // The RMW of bytes 100..200 starts first and reads the block; the aligned write of the
        // whole block arrives while that read is in flight. The aligned write must land after
        // the RMW's write-back, not be overwritten by the stale block the RMW read.
        let block = with_export(1, |l| async move {
            let rmw = write_task(&l, 100, vec![0xaa; 100]);
            let whole = write_task(&l, 0, vec![0xbb; 4096]);
            rmw.await.expect("rmw write");
            whole.await.expect("aligned write");
        });
        assert!(block.iter().all(|&b| b == 0xbb), "the aligned write, acknowledged last, is what the block holds");
    }

    #[test]
    fn punch_during_a_read_modify_write_is_not_lost() {
        let block = with_export(2, |l| async move {
            write_bytes(&l, BS, 0, vec![0x11; 4096]).await.expect("fill");
            let rmw = write_task(&l, 100, vec![0xaa; 100]);
            let l3 = l.clone();
            let punch = ferrite_reactor::spawn_local(async move { clear_range(&l3, BS, 0, 4096, IoType::Unmap).await });
            rmw.await.expect("rmw write");
            punch.await.expect("punch");
        });
        assert!(block.iter().all(|&b| b == 0), "the punch, acknowledged last, is what the block holds");
    }

    #[test]
    fn unaligned_writes_to_one_block_all_land() {
        // Eight RMWs of disjoint byte ranges of the same block, all in flight at once.
        let block = with_export(3, |l| async move {
            let tasks: Vec<_> = (0..8u8).map(|i| write_task(&l, 1 + i as u64 * 500, vec![i + 1; 300])).collect();
            for t in tasks {
                t.await.expect("rmw write");
            }
        });
        for i in 0..8usize {
            let at = 1 + i * 500;
            assert!(block[at..at + 300].iter().all(|&b| b == i as u8 + 1), "write {i} landed");
        }
        assert_eq!(block[0], 0);
    }
}
