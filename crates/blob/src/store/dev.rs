//! The blobstore's access to its device for metadata: whole pages and byte ranges read and
//! written through the bdev layer on the calling reactor, flushes that are barriers on a device
//! with a volatile write cache, zeroing and unmapping of block ranges.
//!
//! Not the data path: each call allocates its buffer and waits for its one request.

use ferrite_bdev::{BdevDesc, IoRequest, IoStatus, IoType};
use std::sync::Arc;

/// Most bytes one request of the metadata path moves (larger reads and writes are split).
const MAX_CHUNK: usize = 1 << 20;

/// Why a device request failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevError(pub String);

impl std::fmt::Display for DevError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DevError {}

/// The device under a blobstore: an open, claimed, writable descriptor of its bdev.
#[derive(Clone)]
pub struct Dev {
    desc: Arc<BdevDesc>,
    block_size: u32,
    write_cache: bool,
    can_flush: bool,
    can_unmap: bool,
    can_write_zeroes: bool,
    can_copy: bool,
}

impl std::fmt::Debug for Dev {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Dev({}, {} x {} B)", self.desc.bdev().name(), self.num_blocks(), self.block_size)
    }
}

impl Dev {
    /// The device behind `desc` (opened for writing).
    pub fn new(desc: BdevDesc) -> Dev {
        let b = desc.bdev().clone();
        Dev {
            block_size: b.block_size(),
            write_cache: b.limits().write_cache,
            can_flush: b.supports(IoType::Flush),
            can_unmap: b.supports(IoType::Unmap),
            can_write_zeroes: b.supports(IoType::WriteZeroes),
            can_copy: b.supports(IoType::Copy),
            desc: Arc::new(desc),
        }
    }

    /// True if `other` is a handle of the same open descriptor (not merely of the same bdev).
    pub fn same(&self, other: &Dev) -> bool {
        Arc::ptr_eq(&self.desc, &other.desc)
    }

    /// The descriptor.
    pub fn desc(&self) -> &BdevDesc {
        &self.desc
    }

    /// Bytes per block.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    /// Number of blocks.
    pub fn num_blocks(&self) -> u64 {
        self.desc.bdev().num_blocks()
    }

    /// Bytes on the device.
    pub fn size(&self) -> u64 {
        self.num_blocks() * self.block_size as u64
    }

    fn check(&self, what: &str, offset: u64, len: u64) -> Result<(u64, u64), DevError> {
        let bs = self.block_size as u64;
        if !offset.is_multiple_of(bs) || !len.is_multiple_of(bs) {
            return Err(DevError(format!("{what} of {len} bytes at {offset} is not block aligned")));
        }
        let (first, n) = (offset / bs, len / bs);
        if first.checked_add(n).is_none_or(|end| end > self.num_blocks()) {
            return Err(DevError(format!("{what} of {len} bytes at {offset} is beyond the device")));
        }
        Ok((first, n))
    }

    async fn run(&self, what: &str, req: IoRequest) -> Result<ferrite_bdev::Completed, DevError> {
        let ch = self.desc.channel().map_err(|e| DevError(format!("{what}: {e}")))?;
        let (at, n) = (req.offset_blocks, req.num_blocks);
        let c = ch.submit_wait(req).await;
        if c.status != IoStatus::Success {
            return Err(DevError(format!("{what} of blocks {at}+{n}: {}", c.status)));
        }
        Ok(c)
    }

    /// Reads `len` bytes at byte `offset` (both block aligned).
    pub async fn read(&self, offset: u64, len: usize) -> Result<Vec<u8>, DevError> {
        self.check("read", offset, len as u64)?;
        let mut out = Vec::with_capacity(len);
        let mut pos = 0usize;
        while pos < len {
            let n = (len - pos).min(MAX_CHUNK);
            let (first, blocks) = self.check("read", offset + pos as u64, n as u64)?;
            let req = IoRequest::read(first, blocks, ferrite_reactor::alloc_buf(n));
            let c = self.run("read", req).await?;
            for b in c.req.bufs.iter() {
                out.extend_from_slice(b);
            }
            pos += n;
        }
        Ok(out)
    }

    /// Writes `data` at byte `offset` (both block aligned).
    pub async fn write(&self, offset: u64, data: &[u8]) -> Result<(), DevError> {
        self.check("write", offset, data.len() as u64)?;
        for (i, chunk) in data.chunks(MAX_CHUNK).enumerate() {
            let (first, blocks) = self.check("write", offset + (i * MAX_CHUNK) as u64, chunk.len() as u64)?;
            let mut buf = ferrite_reactor::alloc_buf(chunk.len());
            buf.copy_from_slice(chunk);
            self.run("write", IoRequest::write(first, blocks, buf)).await?;
        }
        Ok(())
    }

    /// Copies `len` bytes at byte `src_offset` of `src` to byte `dst_offset` here (a first
    /// write's copy-on-write), one buffer per chunk going from the read straight to the write;
    /// what lies past the end of `src` is written as zeroes.
    pub async fn copy_from(&self, src: &Dev, src_offset: u64, dst_offset: u64, len: u64) -> Result<(), DevError> {
        let (dst_first, blocks) = self.check("copy", dst_offset, len)?;
        // Within one device that copies itself (a malloc bdev: one memcpy), one request.
        if self.can_copy && Arc::ptr_eq(&self.desc, &src.desc) && src_offset.is_multiple_of(self.block_size as u64) {
            let (src_first, _) = self.check("copy", src_offset, len)?;
            return self.run("copy", IoRequest::copy(dst_first, src_first, blocks)).await.map(|_| ());
        }
        let mut pos = 0u64;
        while pos < len {
            let n = (len - pos).min(MAX_CHUNK as u64);
            let (first, blocks) = self.check("copy", dst_offset + pos, n)?;
            let avail = src.size().saturating_sub(src_offset + pos).min(n);
            let buf = if avail == n {
                let (sf, sb) = src.check("copy", src_offset + pos, n)?;
                let mut c = src.run("copy", IoRequest::read(sf, sb, ferrite_reactor::alloc_buf(n as usize))).await?;
                c.req.bufs.pop().expect("the read's buffer")
            } else {
                let mut buf = ferrite_reactor::alloc_buf(n as usize);
                buf.zero();
                if avail > 0 {
                    let part = src.read(src_offset + pos, avail as usize).await?;
                    buf[..part.len()].copy_from_slice(&part);
                }
                buf
            };
            self.run("copy", IoRequest::write(first, blocks, buf)).await?;
            pos += n;
        }
        Ok(())
    }

    /// Makes every completed write durable, if the device has a volatile write cache (a
    /// barrier between writes that must reach the medium in order).
    pub async fn flush(&self) -> Result<(), DevError> {
        if !self.write_cache || !self.can_flush {
            return Ok(());
        }
        self.run("flush", IoRequest::new(IoType::Flush, 0, self.num_blocks())).await.map(|_| ())
    }

    /// Zeroes `len` bytes at byte `offset`: write zeroes if the device has it, else writes of
    /// zeroed buffers.
    pub async fn write_zeroes(&self, offset: u64, len: u64) -> Result<(), DevError> {
        let (first, blocks) = self.check("write zeroes", offset, len)?;
        if blocks == 0 {
            return Ok(());
        }
        if self.can_write_zeroes {
            return self.run("write zeroes", IoRequest::new(IoType::WriteZeroes, first, blocks)).await.map(|_| ());
        }
        let zeroes = vec![0u8; MAX_CHUNK.min(len as usize)];
        let mut pos = 0u64;
        while pos < len {
            let n = (len - pos).min(MAX_CHUNK as u64) as usize;
            self.write(offset + pos, &zeroes[..n]).await?;
            pos += n as u64;
        }
        Ok(())
    }

    /// Unmaps `len` bytes at byte `offset`, if the device can (else nothing: unmap is advice).
    pub async fn unmap(&self, offset: u64, len: u64) -> Result<(), DevError> {
        let (first, blocks) = self.check("unmap", offset, len)?;
        if blocks == 0 || !self.can_unmap {
            return Ok(());
        }
        self.run("unmap", IoRequest::new(IoType::Unmap, first, blocks)).await.map(|_| ())
    }
}
