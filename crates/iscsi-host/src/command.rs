//! Bdev requests as SCSI commands: READ (16), WRITE (16) (FUA as asked), SYNCHRONIZE CACHE
//! (16) for a flush, UNMAP with its parameter list (in a pool buffer the task keeps).

use crate::scsi::{self, Cdb};
use ferrite_bdev::{BdevIo, IoFlags, IoStatus, IoType};
use ferrite_reactor::IoBuf;

/// A SCSI command to send.
pub struct Command {
    /// The CDB.
    pub cdb: Cdb,
    /// Data flows to the initiator.
    pub read: bool,
    /// Expected Data Transfer Length.
    pub len: u32,
    /// Data to send other than the request's buffers (an UNMAP parameter list).
    pub extra: Option<IoBuf>,
}

/// How UNMAP commands are cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnmapLimits {
    /// Most blocks per descriptor.
    pub per_descriptor: u32,
    /// Most descriptors per command.
    pub descriptors: u32,
}

/// The command for `io`, or the status it fails with.
pub fn of(io: &BdevIo, unmap: UnmapLimits) -> Result<Command, IoStatus> {
    let r = &io.req;
    // Reads and writes are cut to the bdev's limits: their lengths fit.
    let rw = || -> Result<(u32, u32), IoStatus> {
        let bytes = u32::try_from(io.len_bytes()).map_err(|_| IoStatus::Failed(libc::EINVAL))?;
        let blocks = u32::try_from(r.num_blocks).map_err(|_| IoStatus::Failed(libc::EINVAL))?;
        Ok((bytes, blocks))
    };
    Ok(match r.io_type {
        IoType::Read => {
            let (bytes, blocks) = rw()?;
            Command { cdb: scsi::read16(r.offset_blocks, blocks), read: true, len: bytes, extra: None }
        }
        IoType::Write => {
            let (bytes, blocks) = rw()?;
            let cdb = scsi::write16(r.offset_blocks, blocks, r.flags.contains(IoFlags::FUA));
            Command { cdb, read: false, len: bytes, extra: None }
        }
        IoType::Flush => Command { cdb: scsi::synchronize_cache16(), read: false, len: 0, extra: None },
        IoType::Unmap => {
            let n = r.num_blocks.div_ceil(u64::from(unmap.per_descriptor.max(1)));
            let len = scsi::unmap_list_len(n.min(u64::from(unmap.descriptors)) as usize);
            let mut buf = ferrite_reactor::alloc_buf(len);
            let len =
                scsi::unmap_list(r.offset_blocks, r.num_blocks, unmap.per_descriptor, unmap.descriptors, &mut buf)
                    .ok_or(IoStatus::Failed(libc::EINVAL))?;
            buf.set_len(len);
            Command { cdb: scsi::unmap(len as u16), read: false, len: len as u32, extra: Some(buf) }
        }
        _ => return Err(IoStatus::Unsupported),
    })
}
