//! The NVMe and SCSI code values the translation names (SPDK's `nvme_spec.h` and
//! `scsi_spec.h`; SBC-4 for the ASC/ASCQ pairs SPDK does not name).

/// NVMe Status Code Types and status codes: the wire format's own (`ferrite_nvme::spec::status`),
/// under the names the tables use.
pub mod nvme {
    use ferrite_nvme::spec::status::sct;
    pub use ferrite_nvme::spec::status::{command_specific, generic, media};

    /// Generic Command Status.
    pub const SCT_GENERIC: u8 = sct::GENERIC;
    /// Command Specific Status.
    pub const SCT_COMMAND_SPECIFIC: u8 = sct::COMMAND_SPECIFIC;
    /// Media and Data Integrity Errors.
    pub const SCT_MEDIA_ERROR: u8 = sct::MEDIA_ERROR;
    /// Path Related Status.
    pub const SCT_PATH: u8 = sct::PATH;
    /// Vendor Specific.
    pub const SCT_VENDOR_SPECIFIC: u8 = sct::VENDOR_SPECIFIC;
}

/// SCSI status, sense key, and ASC/ASCQ values.
pub mod scsi {
    /// GOOD status.
    pub const STATUS_GOOD: u8 = 0x00;
    /// CHECK CONDITION status (the sense data says why).
    pub const STATUS_CHECK_CONDITION: u8 = 0x02;
    /// BUSY status.
    pub const STATUS_BUSY: u8 = 0x08;
    /// RESERVATION CONFLICT status.
    pub const STATUS_RESERVATION_CONFLICT: u8 = 0x18;
    /// TASK SET FULL status.
    pub const STATUS_TASK_SET_FULL: u8 = 0x28;
    /// ACA ACTIVE status.
    pub const STATUS_ACA_ACTIVE: u8 = 0x30;
    /// TASK ABORTED status.
    pub const STATUS_TASK_ABORTED: u8 = 0x40;

    /// NO SENSE.
    pub const SENSE_NO_SENSE: u8 = 0x00;
    /// RECOVERED ERROR.
    pub const SENSE_RECOVERED_ERROR: u8 = 0x01;
    /// NOT READY.
    pub const SENSE_NOT_READY: u8 = 0x02;
    /// MEDIUM ERROR.
    pub const SENSE_MEDIUM_ERROR: u8 = 0x03;
    /// HARDWARE ERROR.
    pub const SENSE_HARDWARE_ERROR: u8 = 0x04;
    /// ILLEGAL REQUEST.
    pub const SENSE_ILLEGAL_REQUEST: u8 = 0x05;
    /// UNIT ATTENTION.
    pub const SENSE_UNIT_ATTENTION: u8 = 0x06;
    /// DATA PROTECT.
    pub const SENSE_DATA_PROTECT: u8 = 0x07;
    /// ABORTED COMMAND.
    pub const SENSE_ABORTED_COMMAND: u8 = 0x0b;
    /// MISCOMPARE.
    pub const SENSE_MISCOMPARE: u8 = 0x0e;

    /// NO ADDITIONAL SENSE INFORMATION (ASC 00h).
    pub const ASC_NO_ADDITIONAL_SENSE: u8 = 0x00;
    /// PERIPHERAL DEVICE WRITE FAULT (ASC 03h).
    pub const ASC_PERIPHERAL_DEVICE_WRITE_FAULT: u8 = 0x03;
    /// LOGICAL UNIT NOT READY (ASC 04h).
    pub const ASC_LOGICAL_UNIT_NOT_READY: u8 = 0x04;
    /// WARNING (ASC 0Bh).
    pub const ASC_WARNING: u8 = 0x0b;
    /// LOGICAL BLOCK GUARD / APPLICATION TAG / REFERENCE TAG CHECK FAILED (ASC 10h).
    pub const ASC_LOGICAL_BLOCK_PI_CHECK_FAILED: u8 = 0x10;
    /// UNRECOVERED READ ERROR (ASC 11h).
    pub const ASC_UNRECOVERED_READ_ERROR: u8 = 0x11;
    /// MISCOMPARE DURING VERIFY OPERATION (ASC 1Dh).
    pub const ASC_MISCOMPARE_DURING_VERIFY_OPERATION: u8 = 0x1d;
    /// INVALID COMMAND OPERATION CODE, and ACCESS DENIED with its own ASCQs (ASC 20h).
    pub const ASC_INVALID_COMMAND_OPERATION_CODE: u8 = 0x20;
    /// ACCESS DENIED (ASC 20h, ASCQ 02h-0Bh).
    pub const ASC_ACCESS_DENIED: u8 = 0x20;
    /// LOGICAL BLOCK ADDRESS OUT OF RANGE (ASC 21h).
    pub const ASC_LOGICAL_BLOCK_ADDRESS_OUT_OF_RANGE: u8 = 0x21;
    /// INVALID FIELD IN CDB (ASC 24h).
    pub const ASC_INVALID_FIELD_IN_CDB: u8 = 0x24;
    /// LOGICAL UNIT NOT SUPPORTED (ASC 25h).
    pub const ASC_LOGICAL_UNIT_NOT_SUPPORTED: u8 = 0x25;
    /// WRITE PROTECTED (ASC 27h; ASCQ 07h: SPACE ALLOCATION FAILED WRITE PROTECT).
    pub const ASC_WRITE_PROTECTED: u8 = 0x27;
    /// FORMAT COMMAND FAILED (ASC 31h).
    pub const ASC_FORMAT_COMMAND_FAILED: u8 = 0x31;
    /// INTERNAL TARGET FAILURE (ASC 44h).
    pub const ASC_INTERNAL_TARGET_FAILURE: u8 = 0x44;

    /// Cause not reportable (ASCQ 00h).
    pub const ASCQ_CAUSE_NOT_REPORTABLE: u8 = 0x00;
    /// FORMAT COMMAND FAILED (ASCQ 01h of ASC 31h).
    pub const ASCQ_FORMAT_COMMAND_FAILED: u8 = 0x01;
    /// LOGICAL BLOCK GUARD CHECK FAILED (ASCQ 01h of ASC 10h).
    pub const ASCQ_LOGICAL_BLOCK_GUARD_CHECK_FAILED: u8 = 0x01;
    /// LOGICAL BLOCK APPLICATION TAG CHECK FAILED (ASCQ 02h of ASC 10h).
    pub const ASCQ_LOGICAL_BLOCK_APP_TAG_CHECK_FAILED: u8 = 0x02;
    /// NO ACCESS RIGHTS (ASCQ 02h of ASC 20h).
    pub const ASCQ_NO_ACCESS_RIGHTS: u8 = 0x02;
    /// LOGICAL BLOCK REFERENCE TAG CHECK FAILED (ASCQ 03h of ASC 10h).
    pub const ASCQ_LOGICAL_BLOCK_REF_TAG_CHECK_FAILED: u8 = 0x03;
    /// SPACE ALLOCATION FAILED WRITE PROTECT (ASCQ 07h of ASC 27h).
    pub const ASCQ_SPACE_ALLOCATION_FAILED_WRITE_PROTECT: u8 = 0x07;
    /// POWER LOSS EXPECTED (ASCQ 08h of ASC 0Bh).
    pub const ASCQ_POWER_LOSS_EXPECTED: u8 = 0x08;
    /// INVALID LU IDENTIFIER (ASCQ 09h of ASC 20h).
    pub const ASCQ_INVALID_LU_IDENTIFIER: u8 = 0x09;
}
