//! The crash disk: an in-memory bdev with a volatile write cache whose power can be cut, for
//! crash-consistency tests of on-disk metadata (the blobstore's).
//!
//! Every block has a durable image and, since the last flush, the list of versions written to it
//! (write, write zeroes and unmap all write versions; unmapped blocks read zeroes). Reads see the
//! newest version. A flush makes every block's newest version durable. [`CrashDisk::crash`] cuts
//! the power: each block independently keeps some prefix of its unflushed versions (none, some,
//! or all, as a seeded generator decides), so writes not yet flushed are lost or kept in any
//! combination across blocks, a multi-block write in flight is torn at block granularity, and
//! one block's versions are never reordered. A block is the unit the disk writes atomically
//! (`atomic_write_unit` 1). [`CrashDisk::crash_at`] cuts it at the n-th write or flush, a crash
//! point a seed can choose. After the cut every request fails (`IoStatus::Failed`) until the
//! bdev is deleted; [`CrashDisk::image`] gives what survived, from which a test makes a new disk.
//!
//! The model is of a disk, not of Ferrite's I/O path: it serves requests inside `submit`
//! (completing them on the next loop turn, as malloc does) and keeps its state behind a mutex.
//! That lock is taken per I/O: this is a test device, not a data path.
//! No RPC creates it; tests do, through [`create`].

use ferrite_bdev::bdev::{check_geometry, register, BackendChannel, Bdev, BdevBackend, BdevError, BdevProps, Limits};
use ferrite_bdev::io::{BdevIo, IoStatus, IoType, IoTypes};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

/// The I/O types the crash disk serves.
pub const IO_TYPES: IoTypes =
    IoTypes::of(&[IoType::Read, IoType::Write, IoType::Flush, IoType::Unmap, IoType::WriteZeroes, IoType::Reset]);

/// What the disk holds and what it has not made durable yet.
struct DiskState {
    block_size: usize,
    /// Blocks as they would be after a power cut that lost every unflushed write.
    durable: Vec<u8>,
    /// Per block written since the last flush, its versions oldest first.
    unflushed: BTreeMap<u64, Vec<Box<[u8]>>>,
    /// Power was cut: every request fails.
    crashed: bool,
    /// Requests served, by kind.
    counts: CrashDiskCounts,
    /// Cut the power when this many writes and flushes have been submitted (the last one
    /// torn), deciding with this.
    armed: Option<(u64, Chooser)>,
}

/// Decides how many of a block's `n` unflushed versions survive a power cut (`0..=n`).
type Chooser = Box<dyn FnMut(usize) -> usize + Send>;

/// How many requests a crash disk served, by kind.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CrashDiskCounts {
    /// Reads.
    pub reads: u64,
    /// Writes, write zeroes and unmaps.
    pub writes: u64,
    /// Flushes.
    pub flushes: u64,
    /// Requests refused because the power was cut.
    pub failed: u64,
}

impl DiskState {
    fn block(&self, lba: u64) -> &[u8] {
        match self.unflushed.get(&lba).and_then(|v| v.last()) {
            Some(b) => b,
            None => {
                let at = lba as usize * self.block_size;
                &self.durable[at..at + self.block_size]
            }
        }
    }

    fn write_block(&mut self, lba: u64, data: Box<[u8]>) {
        self.unflushed.entry(lba).or_default().push(data);
    }

    fn cut_power(&mut self, choose: &mut dyn FnMut(usize) -> usize) {
        let bs = self.block_size;
        for (lba, versions) in std::mem::take(&mut self.unflushed) {
            let keep = choose(versions.len()).min(versions.len());
            if keep > 0 {
                let at = lba as usize * bs;
                self.durable[at..at + bs].copy_from_slice(&versions[keep - 1]);
            }
        }
        self.crashed = true;
    }

    /// Counts a write or flush; true if that one cuts the power (armed by `crash_at`).
    fn tick(&mut self) -> bool {
        let n = self.counts.writes + self.counts.flushes;
        match self.armed.take() {
            Some((at, mut choose)) if n >= at => {
                self.cut_power(&mut *choose);
                true
            }
            other => {
                self.armed = other;
                false
            }
        }
    }

    fn flush(&mut self) {
        let bs = self.block_size;
        for (lba, versions) in std::mem::take(&mut self.unflushed) {
            if let Some(newest) = versions.last() {
                let at = lba as usize * bs;
                self.durable[at..at + bs].copy_from_slice(newest);
            }
        }
    }
}

/// A handle on a crash disk: cut its power, read what survived, count its requests.
#[derive(Clone)]
pub struct CrashDisk {
    state: Arc<Mutex<DiskState>>,
    bdev: Bdev,
}

impl CrashDisk {
    /// The bdev.
    pub fn bdev(&self) -> &Bdev {
        &self.bdev
    }

    fn lock(&self) -> MutexGuard<'_, DiskState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Cuts the power: each block keeps a prefix of its unflushed versions chosen by
    /// `choose(n)`, which returns a number in `0..=n` (how many of the block's `n` unflushed
    /// versions survive). From then on every request fails.
    pub fn crash(&self, mut choose: impl FnMut(usize) -> usize) {
        self.lock().cut_power(&mut choose);
    }

    /// Cuts the power when the `n`th write or flush (counting from 1, all kinds together,
    /// those already served included) is submitted: that request is torn (its blocks count as
    /// unflushed versions, like every other) and fails, as does everything after it.
    pub fn crash_at(&self, n: u64, choose: impl FnMut(usize) -> usize + Send + 'static) {
        self.lock().armed = Some((n, Box::new(choose)));
    }

    /// Whether the power was cut.
    pub fn crashed(&self) -> bool {
        self.lock().crashed
    }

    /// The durable image: after [`CrashDisk::crash`], what survived; before, what a crash that
    /// kept no unflushed write would leave.
    pub fn image(&self) -> Vec<u8> {
        self.lock().durable.clone()
    }

    /// The image as reads see it now (unflushed writes included).
    pub fn current_image(&self) -> Vec<u8> {
        let st = self.lock();
        let n = st.durable.len() / st.block_size;
        let mut out = Vec::with_capacity(st.durable.len());
        for lba in 0..n as u64 {
            out.extend_from_slice(st.block(lba));
        }
        out
    }

    /// Blocks written since the last flush.
    pub fn unflushed_blocks(&self) -> usize {
        self.lock().unflushed.len()
    }

    /// Requests served so far.
    pub fn counts(&self) -> CrashDiskCounts {
        self.lock().counts
    }
}

struct CrashBackend {
    state: Arc<Mutex<DiskState>>,
}

struct CrashChannel {
    state: Arc<Mutex<DiskState>>,
}

impl BackendChannel for CrashChannel {
    fn submit(&mut self, mut io: BdevIo) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.crashed {
            st.counts.failed += 1;
            drop(st);
            io.complete_deferred(IoStatus::Failed(libc::EIO));
            return;
        }
        let bs = st.block_size;
        let first = io.req.offset_blocks;
        let n = io.req.num_blocks;
        match io.req.io_type {
            IoType::Read => {
                st.counts.reads += 1;
                let mut lba = first;
                let mut in_block = 0usize;
                for b in io.req.bufs.iter_mut() {
                    let mut done = 0;
                    let dst: &mut [u8] = &mut b[..];
                    while done < dst.len() {
                        let src = &st.block(lba)[in_block..];
                        let k = src.len().min(dst.len() - done);
                        dst[done..done + k].copy_from_slice(&src[..k]);
                        done += k;
                        in_block += k;
                        if in_block == bs {
                            in_block = 0;
                            lba += 1;
                        }
                    }
                }
            }
            IoType::Write => {
                st.counts.writes += 1;
                let mut data = Vec::with_capacity(n as usize * bs);
                for b in io.req.bufs.iter() {
                    data.extend_from_slice(&b[..]);
                }
                for (i, chunk) in data.chunks(bs).enumerate() {
                    st.write_block(first + i as u64, chunk.into());
                }
                if st.tick() {
                    drop(st);
                    return io.complete_deferred(IoStatus::Failed(libc::EIO));
                }
            }
            IoType::WriteZeroes | IoType::Unmap => {
                st.counts.writes += 1;
                for lba in first..first + n {
                    st.write_block(lba, vec![0u8; bs].into_boxed_slice());
                }
                if st.tick() {
                    drop(st);
                    return io.complete_deferred(IoStatus::Failed(libc::EIO));
                }
            }
            IoType::Flush => {
                st.counts.flushes += 1;
                if st.tick() {
                    drop(st);
                    return io.complete_deferred(IoStatus::Failed(libc::EIO));
                }
                st.flush();
            }
            _ => {}
        }
        drop(st);
        io.complete_deferred(IoStatus::Success);
    }
}

impl BdevBackend for CrashBackend {
    fn create_channel(&self) -> Result<Box<dyn BackendChannel>, BdevError> {
        Ok(Box::new(CrashChannel { state: self.state.clone() }))
    }

    fn config_entry(&self, _bdev: &Bdev) -> Option<serde_json::Value> {
        None
    }
}

/// Creates a crash disk named `name` of `block_size`-byte blocks holding `image` (whose length
/// is a multiple of the block size), all of it durable.
pub fn create(name: &str, block_size: u32, image: Vec<u8>) -> Result<CrashDisk, BdevError> {
    let bs = block_size as usize;
    if bs == 0 || image.is_empty() || !image.len().is_multiple_of(bs) {
        return Err(BdevError::Invalid(format!(
            "a crash disk image of {} bytes is not a whole number of {block_size}-byte blocks",
            image.len()
        )));
    }
    let num_blocks = (image.len() / bs) as u64;
    check_geometry(block_size, num_blocks)?;
    let state = Arc::new(Mutex::new(DiskState {
        block_size: bs,
        durable: image,
        unflushed: BTreeMap::new(),
        crashed: false,
        counts: CrashDiskCounts::default(),
        armed: None,
    }));
    let props = BdevProps {
        name: name.to_string(),
        aliases: vec![],
        uuid: None,
        block_size,
        num_blocks,
        product_name: "Crash disk",
        module: "crash_disk",
        io_types: IO_TYPES,
        limits: Limits { write_cache: true, atomic_write_unit: 1, ..Limits::default() },
    };
    let bdev = register(props, Arc::new(CrashBackend { state: state.clone() }))?;
    Ok(CrashDisk { state, bdev })
}
