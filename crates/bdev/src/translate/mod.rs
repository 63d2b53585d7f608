//! Statuses across protocols, in one place: a bdev status as NVMe and SCSI targets answer it,
//! and NVMe and SCSI statuses as each other (a remote NVMe namespace under a SCSI target, a
//! SCSI device under an NVMe target). Targets translate with these and nothing else, so that a
//! status means the same through every transport.
//!
//! - [`nvme_to_scsi`]: SPDK's `spdk_scsi_nvme_translate`, every row ([`table::NVME_TO_SCSI`]).
//! - [`scsi_to_nvme`]: its inverse, and what the reverse direction adds (see [`table`]).
//! - [`scsi_of`]: a bdev status as SPDK's `spdk_bdev_io_get_scsi_status` gives it, with the
//!   layer's own statuses (range, write protection, a full volume) named as SCSI names them.
//! - [`nvme_of`]: a bdev status as an NVMe target answers it.
//!
//! Not on the success path of any I/O: targets check `is_ok` first.

pub mod codes;
pub mod table;

use crate::io::IoStatus;
use codes::nvme::{generic as g, media as m, SCT_GENERIC, SCT_MEDIA_ERROR};
use codes::scsi::*;
pub use table::{nvme_to_scsi, scsi_to_nvme};

/// A SCSI status with its sense key and additional sense code and qualifier (meaningful under
/// CHECK CONDITION; zero otherwise).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sense {
    /// SCSI status byte.
    pub status: u8,
    /// Sense key.
    pub key: u8,
    /// Additional sense code.
    pub asc: u8,
    /// Additional sense code qualifier.
    pub ascq: u8,
}

impl Sense {
    /// CHECK CONDITION with `key`, `asc`, `ascq`.
    pub const fn check(key: u8, asc: u8, ascq: u8) -> Sense {
        Sense { status: STATUS_CHECK_CONDITION, key, asc, ascq }
    }
}

/// An NVMe completion status: type, code and Do Not Retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NvmeStatus {
    /// Status code type.
    pub sct: u8,
    /// Status code.
    pub sc: u8,
    /// Do Not Retry.
    pub dnr: bool,
}

impl NvmeStatus {
    const fn new(sct: u8, sc: u8, dnr: bool) -> NvmeStatus {
        NvmeStatus { sct, sc, dnr }
    }
}

/// The SCSI status and sense for a bdev status. A miscompare's first differing byte is in the
/// status itself (`IoStatus::Miscompare { offset }`), for the sense's INFORMATION field.
pub fn scsi_of(s: IoStatus) -> Sense {
    match s {
        IoStatus::Success => Sense { status: STATUS_GOOD, key: SENSE_NO_SENSE, asc: 0, ascq: 0 },
        IoStatus::OutOfRange => Sense::check(SENSE_ILLEGAL_REQUEST, ASC_LOGICAL_BLOCK_ADDRESS_OUT_OF_RANGE, 0),
        IoStatus::Misaligned => Sense::check(SENSE_ILLEGAL_REQUEST, ASC_INVALID_FIELD_IN_CDB, 0),
        IoStatus::Unsupported => Sense::check(SENSE_ILLEGAL_REQUEST, ASC_INVALID_COMMAND_OPERATION_CODE, 0),
        // SPDK's answer for a logical unit that is gone (hot removed).
        IoStatus::Removed => Sense::check(SENSE_ILLEGAL_REQUEST, ASC_LOGICAL_UNIT_NOT_SUPPORTED, 0),
        IoStatus::Miscompare { .. } => Sense::check(SENSE_MISCOMPARE, ASC_MISCOMPARE_DURING_VERIFY_OPERATION, 0),
        // A thin volume whose store is full, and a read-only bdev (SBC-4's names).
        IoStatus::Failed(libc::ENOSPC) => {
            Sense::check(SENSE_DATA_PROTECT, ASC_WRITE_PROTECTED, ASCQ_SPACE_ALLOCATION_FAILED_WRITE_PROTECT)
        }
        IoStatus::Failed(libc::EROFS) => Sense::check(SENSE_DATA_PROTECT, ASC_WRITE_PROTECTED, 0),
        IoStatus::Nvme { sct, sc, .. } => nvme_to_scsi(sct, sc),
        IoStatus::Scsi { status, key, asc, ascq } => Sense { status, key, asc, ascq },
        // SPDK's default for the rest (failed, aborted, out of memory): ABORTED COMMAND, which
        // initiators retry.
        IoStatus::Failed(_) | IoStatus::Aborted | IoStatus::TimedOut | IoStatus::NoMem => {
            Sense::check(SENSE_ABORTED_COMMAND, ASC_NO_ADDITIONAL_SENSE, 0)
        }
    }
}

/// The NVMe status for a bdev status, as Ferrite's NVMe/TCP target answers it. A status an
/// NVMe device answered passes through whole (its DNR as the device set it); the layer's own
/// get DNR where the same command would fail again.
#[inline]
pub fn nvme_of(s: IoStatus) -> NvmeStatus {
    match s {
        IoStatus::Success => NvmeStatus::new(SCT_GENERIC, g::SUCCESS, false),
        IoStatus::OutOfRange => NvmeStatus::new(SCT_GENERIC, g::LBA_OUT_OF_RANGE, true),
        IoStatus::Misaligned => NvmeStatus::new(SCT_GENERIC, g::INVALID_FIELD, true),
        IoStatus::Unsupported => NvmeStatus::new(SCT_GENERIC, g::INVALID_OPCODE, true),
        IoStatus::Removed => NvmeStatus::new(SCT_GENERIC, g::INVALID_NAMESPACE_OR_FORMAT, true),
        IoStatus::Aborted | IoStatus::TimedOut => NvmeStatus::new(SCT_GENERIC, g::ABORTED_BY_REQUEST, false),
        IoStatus::Miscompare { .. } => NvmeStatus::new(SCT_MEDIA_ERROR, m::COMPARE_FAILURE, true),
        IoStatus::Nvme { sct, sc, dnr, .. } => NvmeStatus::new(sct, sc, dnr),
        // A thin volume whose store is full: hosts report "no space" (Linux: BLK_STS_NOSPC,
        // ENOSPC to the file system) and do not retry, where an internal error is an EIO
        // retried several times.
        IoStatus::Failed(libc::ENOSPC) => NvmeStatus::new(SCT_GENERIC, g::CAPACITY_EXCEEDED, true),
        // A write to a read-only bdev (an lvol snapshot).
        IoStatus::Failed(libc::EROFS) => NvmeStatus::new(SCT_GENERIC, g::NAMESPACE_IS_WRITE_PROTECTED, true),
        IoStatus::Scsi { status, key, asc, ascq } => scsi_to_nvme(Sense { status, key, asc, ascq }),
        IoStatus::NoMem | IoStatus::Failed(_) => NvmeStatus::new(SCT_GENERIC, g::INTERNAL_DEVICE_ERROR, false),
    }
}

#[cfg(test)]
mod tests;
