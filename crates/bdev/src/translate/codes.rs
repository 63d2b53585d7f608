//! The NVMe and SCSI code values the translation names (SPDK's `nvme_spec.h` and
//! `scsi_spec.h`; SBC-4 for the ASC/ASCQ pairs SPDK does not name).

/// NVMe Status Code Types and the status codes of each that the tables name.
pub mod nvme {
    /// Generic Command Status.
    pub const SCT_GENERIC: u8 = 0x0;
    /// Command Specific Status.
    pub const SCT_COMMAND_SPECIFIC: u8 = 0x1;
    /// Media and Data Integrity Errors.
    pub const SCT_MEDIA_ERROR: u8 = 0x2;
    /// Path Related Status.
    pub const SCT_PATH: u8 = 0x3;
    /// Vendor Specific.
    pub const SCT_VENDOR_SPECIFIC: u8 = 0x7;

    /// Generic Command Status values (SCT 0).
    pub mod generic {
        /// Successful Completion.
        pub const SUCCESS: u8 = 0x00;
        /// Invalid Command Opcode.
        pub const INVALID_OPCODE: u8 = 0x01;
        /// Invalid Field in Command.
        pub const INVALID_FIELD: u8 = 0x02;
        /// Command ID Conflict.
        pub const COMMAND_ID_CONFLICT: u8 = 0x03;
        /// Data Transfer Error.
        pub const DATA_TRANSFER_ERROR: u8 = 0x04;
        /// Commands Aborted due to Power Loss Notification.
        pub const ABORTED_POWER_LOSS: u8 = 0x05;
        /// Internal Error.
        pub const INTERNAL_DEVICE_ERROR: u8 = 0x06;
        /// Command Abort Requested.
        pub const ABORTED_BY_REQUEST: u8 = 0x07;
        /// Command Aborted due to SQ Deletion.
        pub const ABORTED_SQ_DELETION: u8 = 0x08;
        /// Command Aborted due to Failed Fused Command.
        pub const ABORTED_FAILED_FUSED: u8 = 0x09;
        /// Command Aborted due to Missing Fused Command.
        pub const ABORTED_MISSING_FUSED: u8 = 0x0a;
        /// Invalid Namespace or Format.
        pub const INVALID_NAMESPACE_OR_FORMAT: u8 = 0x0b;
        /// Command Sequence Error.
        pub const COMMAND_SEQUENCE_ERROR: u8 = 0x0c;
        /// Invalid SGL Segment Descriptor.
        pub const INVALID_SGL_SEG_DESCRIPTOR: u8 = 0x0d;
        /// Invalid Number of SGL Descriptors.
        pub const INVALID_NUM_SGL_DESCRIPTORS: u8 = 0x0e;
        /// Data SGL Length Invalid.
        pub const DATA_SGL_LENGTH_INVALID: u8 = 0x0f;
        /// Metadata SGL Length Invalid.
        pub const METADATA_SGL_LENGTH_INVALID: u8 = 0x10;
        /// SGL Descriptor Type Invalid.
        pub const SGL_DESCRIPTOR_TYPE_INVALID: u8 = 0x11;
        /// Invalid Use of Controller Memory Buffer.
        pub const INVALID_CONTROLLER_MEM_BUF: u8 = 0x12;
        /// PRP Offset Invalid.
        pub const INVALID_PRP_OFFSET: u8 = 0x13;
        /// Atomic Write Unit Exceeded.
        pub const ATOMIC_WRITE_UNIT_EXCEEDED: u8 = 0x14;
        /// SGL Offset Invalid.
        pub const INVALID_SGL_OFFSET: u8 = 0x16;
        /// Host Identifier Inconsistent Format.
        pub const HOSTID_INCONSISTENT_FORMAT: u8 = 0x18;
        /// Keep Alive Timer Expired.
        pub const KEEP_ALIVE_EXPIRED: u8 = 0x19;
        /// Keep Alive Timeout Invalid.
        pub const KEEP_ALIVE_INVALID: u8 = 0x1a;
        /// Namespace is Write Protected.
        pub const NAMESPACE_IS_WRITE_PROTECTED: u8 = 0x20;
        /// Command Interrupted (the host may retry).
        pub const COMMAND_INTERRUPTED: u8 = 0x21;
        /// LBA Out of Range.
        pub const LBA_OUT_OF_RANGE: u8 = 0x80;
        /// Capacity Exceeded.
        pub const CAPACITY_EXCEEDED: u8 = 0x81;
        /// Namespace Not Ready.
        pub const NAMESPACE_NOT_READY: u8 = 0x82;
        /// Reservation Conflict.
        pub const RESERVATION_CONFLICT: u8 = 0x83;
        /// Format In Progress.
        pub const FORMAT_IN_PROGRESS: u8 = 0x84;
    }

    /// Command Specific Status values (SCT 1).
    pub mod command_specific {
        /// Completion Queue Invalid.
        pub const COMPLETION_QUEUE_INVALID: u8 = 0x00;
        /// Invalid Queue Identifier.
        pub const INVALID_QUEUE_IDENTIFIER: u8 = 0x01;
        /// Invalid Queue Size.
        pub const INVALID_QUEUE_SIZE: u8 = 0x02;
        /// Abort Command Limit Exceeded.
        pub const ABORT_COMMAND_LIMIT_EXCEEDED: u8 = 0x03;
        /// Asynchronous Event Request Limit Exceeded.
        pub const ASYNC_EVENT_REQUEST_LIMIT_EXCEEDED: u8 = 0x05;
        /// Invalid Firmware Slot.
        pub const INVALID_FIRMWARE_SLOT: u8 = 0x06;
        /// Invalid Firmware Image.
        pub const INVALID_FIRMWARE_IMAGE: u8 = 0x07;
        /// Invalid Interrupt Vector.
        pub const INVALID_INTERRUPT_VECTOR: u8 = 0x08;
        /// Invalid Log Page.
        pub const INVALID_LOG_PAGE: u8 = 0x09;
        /// Invalid Format.
        pub const INVALID_FORMAT: u8 = 0x0a;
        /// Firmware Activation Requires Conventional Reset.
        pub const FIRMWARE_REQ_CONVENTIONAL_RESET: u8 = 0x0b;
        /// Invalid Queue Deletion.
        pub const INVALID_QUEUE_DELETION: u8 = 0x0c;
        /// Feature Identifier Not Saveable.
        pub const FEATURE_ID_NOT_SAVEABLE: u8 = 0x0d;
        /// Feature Not Changeable.
        pub const FEATURE_NOT_CHANGEABLE: u8 = 0x0e;
        /// Feature Not Namespace Specific.
        pub const FEATURE_NOT_NAMESPACE_SPECIFIC: u8 = 0x0f;
        /// Firmware Activation Requires NVM Subsystem Reset.
        pub const FIRMWARE_REQ_NVM_RESET: u8 = 0x10;
        /// Firmware Activation Requires Controller Level Reset.
        pub const FIRMWARE_REQ_RESET: u8 = 0x11;
        /// Firmware Activation Requires Maximum Time Violation.
        pub const FIRMWARE_REQ_MAX_TIME_VIOLATION: u8 = 0x12;
        /// Firmware Activation Prohibited.
        pub const FIRMWARE_ACTIVATION_PROHIBITED: u8 = 0x13;
        /// Overlapping Range.
        pub const OVERLAPPING_RANGE: u8 = 0x14;
        /// Namespace Insufficient Capacity.
        pub const NAMESPACE_INSUFFICIENT_CAPACITY: u8 = 0x15;
        /// Namespace Identifier Unavailable.
        pub const NAMESPACE_ID_UNAVAILABLE: u8 = 0x16;
        /// Namespace Already Attached.
        pub const NAMESPACE_ALREADY_ATTACHED: u8 = 0x18;
        /// Namespace Is Private.
        pub const NAMESPACE_IS_PRIVATE: u8 = 0x19;
        /// Namespace Not Attached.
        pub const NAMESPACE_NOT_ATTACHED: u8 = 0x1a;
        /// Thin Provisioning Not Supported.
        pub const THINPROVISIONING_NOT_SUPPORTED: u8 = 0x1b;
        /// Controller List Invalid.
        pub const CONTROLLER_LIST_INVALID: u8 = 0x1c;
        /// Conflicting Attributes (NVM command set).
        pub const CONFLICTING_ATTRIBUTES: u8 = 0x80;
        /// Invalid Protection Information.
        pub const INVALID_PROTECTION_INFO: u8 = 0x81;
        /// Attempted Write to Read Only Range.
        pub const ATTEMPTED_WRITE_TO_RO_RANGE: u8 = 0x82;
    }

    /// Media and Data Integrity Error values (SCT 2).
    pub mod media {
        /// Write Fault.
        pub const WRITE_FAULTS: u8 = 0x80;
        /// Unrecovered Read Error.
        pub const UNRECOVERED_READ_ERROR: u8 = 0x81;
        /// End-to-end Guard Check Error.
        pub const GUARD_CHECK_ERROR: u8 = 0x82;
        /// End-to-end Application Tag Check Error.
        pub const APPLICATION_TAG_CHECK_ERROR: u8 = 0x83;
        /// End-to-end Reference Tag Check Error.
        pub const REFERENCE_TAG_CHECK_ERROR: u8 = 0x84;
        /// Compare Failure.
        pub const COMPARE_FAILURE: u8 = 0x85;
        /// Access Denied.
        pub const ACCESS_DENIED: u8 = 0x86;
        /// Deallocated or Unwritten Logical Block.
        pub const DEALLOCATED_OR_UNWRITTEN_BLOCK: u8 = 0x87;
    }
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
