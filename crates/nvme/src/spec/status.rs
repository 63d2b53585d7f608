//! The completion status field and the status code values a controller answers with
//! (NVMe Base Specification 2.0, section 4.6.1 "Status Field Definition", figures 92-101;
//! NVMe over Fabrics 1.1 section 3.5 for the Fabrics command specific values).
//!
//! Status code values overlap between status code types, so each type has its own module of
//! constants: `generic::INVALID_FIELD` is SCT 0 SC 02h, `command_specific::INVALID_LOG_PAGE`
//! is SCT 1 SC 09h. The values are the ones in SPDK's `include/spdk/nvme_spec.h` and
//! `nvmf_spec.h`, checked against Linux's `include/linux/nvme.h` and libnvme's `types.h`.

use super::le::{bit, bits, flag, place};

/// Status Code Type values (SCT, status field bits 11:9 of the completion's dword 3 upper half).
pub mod sct {
    /// Generic Command Status: the same meaning for every command.
    pub const GENERIC: u8 = 0x0;
    /// Command Specific Status: the meaning depends on the opcode.
    pub const COMMAND_SPECIFIC: u8 = 0x1;
    /// Media and Data Integrity Errors.
    pub const MEDIA_ERROR: u8 = 0x2;
    /// Path Related Status (NVMe 1.4 and later).
    pub const PATH: u8 = 0x3;
    /// Vendor Specific.
    pub const VENDOR_SPECIFIC: u8 = 0x7;
}

/// Generic Command Status values (SCT 0; NVMe 2.0 figure 94, NVM Command Set 1.0 figure 17 for
/// the values from 80h).
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
    /// Command Abort Requested (the command was the target of an Abort command).
    pub const ABORTED_BY_REQUEST: u8 = 0x07;
    /// Command Aborted due to SQ Deletion.
    pub const ABORTED_SQ_DELETION: u8 = 0x08;
    /// Command Aborted due to Failed Fused Command.
    pub const ABORTED_FAILED_FUSED: u8 = 0x09;
    /// Command Aborted due to Missing Fused Command.
    pub const ABORTED_MISSING_FUSED: u8 = 0x0a;
    /// Invalid Namespace or Format.
    pub const INVALID_NAMESPACE_OR_FORMAT: u8 = 0x0b;
    /// Command Sequence Error (for example a command before Connect on a fabrics queue).
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
    /// Operation Denied.
    pub const OPERATION_DENIED: u8 = 0x15;
    /// SGL Offset Invalid.
    pub const INVALID_SGL_OFFSET: u8 = 0x16;
    /// Host Identifier Inconsistent Format (17h is reserved).
    pub const HOSTID_INCONSISTENT_FORMAT: u8 = 0x18;
    /// Keep Alive Timer Expired.
    pub const KEEP_ALIVE_EXPIRED: u8 = 0x19;
    /// Keep Alive Timeout Invalid.
    pub const KEEP_ALIVE_INVALID: u8 = 0x1a;
    /// Command Aborted due to Preempt and Abort.
    pub const ABORTED_PREEMPT: u8 = 0x1b;
    /// Sanitize Failed.
    pub const SANITIZE_FAILED: u8 = 0x1c;
    /// Sanitize In Progress.
    pub const SANITIZE_IN_PROGRESS: u8 = 0x1d;
    /// SGL Data Block Granularity Invalid.
    pub const SGL_DATA_BLOCK_GRANULARITY_INVALID: u8 = 0x1e;
    /// Command Not Supported for Queue in CMB.
    pub const COMMAND_INVALID_IN_CMB: u8 = 0x1f;
    /// Namespace is Write Protected.
    pub const NAMESPACE_IS_WRITE_PROTECTED: u8 = 0x20;
    /// Command Interrupted (the host may retry).
    pub const COMMAND_INTERRUPTED: u8 = 0x21;
    /// Transient Transport Error.
    pub const TRANSIENT_TRANSPORT_ERROR: u8 = 0x22;
    /// Command Prohibited by Command and Feature Lockdown.
    pub const PROHIBITED_BY_LOCKDOWN: u8 = 0x23;
    /// Admin Command Media Not Ready.
    pub const ADMIN_COMMAND_MEDIA_NOT_READY: u8 = 0x24;
    /// LBA Out of Range (NVM command set).
    pub const LBA_OUT_OF_RANGE: u8 = 0x80;
    /// Capacity Exceeded (NVM command set).
    pub const CAPACITY_EXCEEDED: u8 = 0x81;
    /// Namespace Not Ready (NVM command set).
    pub const NAMESPACE_NOT_READY: u8 = 0x82;
    /// Reservation Conflict (NVM command set).
    pub const RESERVATION_CONFLICT: u8 = 0x83;
    /// Format In Progress (NVM command set).
    pub const FORMAT_IN_PROGRESS: u8 = 0x84;
}

/// Command Specific Status values (SCT 1; NVMe 2.0 figure 95, NVM Command Set 1.0 figure 18).
pub mod command_specific {
    /// Completion Queue Invalid.
    pub const COMPLETION_QUEUE_INVALID: u8 = 0x00;
    /// Invalid Queue Identifier.
    pub const INVALID_QUEUE_IDENTIFIER: u8 = 0x01;
    /// Invalid Queue Size.
    pub const INVALID_QUEUE_SIZE: u8 = 0x02;
    /// Abort Command Limit Exceeded (04h is reserved).
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
    /// Namespace Identifier Unavailable (17h is reserved).
    pub const NAMESPACE_ID_UNAVAILABLE: u8 = 0x16;
    /// Namespace Already Attached.
    pub const NAMESPACE_ALREADY_ATTACHED: u8 = 0x18;
    /// Namespace Is Private.
    pub const NAMESPACE_IS_PRIVATE: u8 = 0x19;
    /// Namespace Not Attached.
    pub const NAMESPACE_NOT_ATTACHED: u8 = 0x1a;
    /// Thin Provisioning Not Supported.
    pub const THIN_PROVISIONING_NOT_SUPPORTED: u8 = 0x1b;
    /// Controller List Invalid.
    pub const CONTROLLER_LIST_INVALID: u8 = 0x1c;
    /// Device Self-test In Progress.
    pub const DEVICE_SELF_TEST_IN_PROGRESS: u8 = 0x1d;
    /// Boot Partition Write Prohibited.
    pub const BOOT_PARTITION_WRITE_PROHIBITED: u8 = 0x1e;
    /// Invalid Controller Identifier.
    pub const INVALID_CTRLR_ID: u8 = 0x1f;
    /// Invalid Secondary Controller State.
    pub const INVALID_SECONDARY_CTRLR_STATE: u8 = 0x20;
    /// Invalid Number of Controller Resources.
    pub const INVALID_NUM_CTRLR_RESOURCES: u8 = 0x21;
    /// Invalid Resource Identifier.
    pub const INVALID_RESOURCE_ID: u8 = 0x22;
    /// Sanitize Prohibited While Persistent Memory Region is Enabled.
    pub const SANITIZE_PROHIBITED: u8 = 0x23;
    /// ANA Group Identifier Invalid.
    pub const ANA_GROUP_IDENTIFIER_INVALID: u8 = 0x24;
    /// ANA Attach Failed.
    pub const ANA_ATTACH_FAILED: u8 = 0x25;
    /// Insufficient Capacity.
    pub const INSUFFICIENT_CAPACITY: u8 = 0x26;
    /// Namespace Attachment Limit Exceeded.
    pub const NAMESPACE_ATTACH_LIMIT_EXCEEDED: u8 = 0x27;
    /// Prohibition of Command Execution Not Supported.
    pub const PROHIBIT_CMD_EXEC_NOT_SUPPORTED: u8 = 0x28;
    /// I/O Command Set Not Supported.
    pub const IOCS_NOT_SUPPORTED: u8 = 0x29;
    /// I/O Command Set Not Enabled.
    pub const IOCS_NOT_ENABLED: u8 = 0x2a;
    /// I/O Command Set Combination Rejected.
    pub const IOCS_COMBINATION_REJECTED: u8 = 0x2b;
    /// Invalid I/O Command Set. Linux's `nvme.h` files this one (`NVME_SC_INVALID_IO_CMD_SET`)
    /// under the generic type; SPDK, libnvme and the base specification have it here.
    pub const INVALID_IOCS: u8 = 0x2c;
    /// Identifier Unavailable.
    pub const IDENTIFIER_UNAVAILABLE: u8 = 0x2d;
    /// Conflicting Attributes (NVM command set: Dataset Management, Read, Write).
    pub const CONFLICTING_ATTRIBUTES: u8 = 0x80;
    /// Invalid Protection Information (NVM command set).
    pub const INVALID_PROTECTION_INFO: u8 = 0x81;
    /// Attempted Write to Read Only Range (NVM command set).
    pub const ATTEMPTED_WRITE_TO_RO_RANGE: u8 = 0x82;
    /// Command Size Limit Exceeded (NVM command set).
    pub const CMD_SIZE_LIMIT_EXCEEDED: u8 = 0x83;
}

/// Command Specific Status values of the Fabrics commands (SCT 1; NVMe over Fabrics 1.1
/// figure 12 and section 3.3; the same numbers as the NVM command set values above, so only
/// meaningful as answers to Fabrics commands and Get Log Page of the discovery log).
pub mod fabrics {
    /// Incompatible Format: the record format (RECFMT) is not supported.
    pub const INCOMPATIBLE_FORMAT: u8 = 0x80;
    /// Controller Busy: the controller is already associated with a host (static model).
    pub const CONTROLLER_BUSY: u8 = 0x81;
    /// Connect Invalid Parameters: the completion's dword 0 carries IATTR and IPO.
    pub const CONNECT_INVALID_PARAMETERS: u8 = 0x82;
    /// Connect Restart Discovery: the requested NVM subsystem is not available.
    pub const CONNECT_RESTART_DISCOVERY: u8 = 0x83;
    /// Connect Invalid Host: the host may not connect to this subsystem or controller.
    pub const CONNECT_INVALID_HOST: u8 = 0x84;
    /// Invalid Queue Type: Disconnect was sent on the Admin Queue (NVMe-oF 1.1). Not in SPDK's
    /// header; libnvme names it `NVME_SC_DISCONNECT_INVALID_QTYPE`.
    pub const INVALID_QUEUE_TYPE: u8 = 0x85;
    /// Discover Restart: the discovery log changed while it was being read.
    pub const DISCOVER_RESTART: u8 = 0x90;
    /// Authentication Required: in-band authentication has not been done on this queue.
    pub const AUTH_REQUIRED: u8 = 0x91;
}

/// Media and Data Integrity Error values (SCT 2; NVMe 2.0 figure 100, NVM Command Set 1.0
/// figure 19).
pub mod media {
    /// Write Fault.
    pub const WRITE_FAULT: u8 = 0x80;
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
    /// End-to-End Storage Tag Check Error.
    pub const STORAGE_TAG_CHECK_ERROR: u8 = 0x88;
}

/// Path Related Status values (SCT 3; NVMe 2.0 figure 101).
pub mod path {
    /// Internal Path Error.
    pub const INTERNAL_PATH_ERROR: u8 = 0x00;
    /// Asymmetric Access Persistent Loss.
    pub const ASYMMETRIC_ACCESS_PERSISTENT_LOSS: u8 = 0x01;
    /// Asymmetric Access Inaccessible.
    pub const ASYMMETRIC_ACCESS_INACCESSIBLE: u8 = 0x02;
    /// Asymmetric Access Transition.
    pub const ASYMMETRIC_ACCESS_TRANSITION: u8 = 0x03;
    /// Controller Pathing Error.
    pub const CONTROLLER_PATH_ERROR: u8 = 0x60;
    /// Host Pathing Error.
    pub const HOST_PATH_ERROR: u8 = 0x70;
    /// Command Aborted By Host.
    pub const ABORTED_BY_HOST: u8 = 0x71;
}

/// The status field of a completion without its phase tag (NVMe 2.0 figure 93): the upper 15
/// bits of the completion's last halfword. The phase tag (bit 0) belongs to the queue, not to
/// the command's outcome, so [`super::cqe::Cqe`] carries it separately.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Status {
    /// Status Code (SC), bits 8:1.
    pub sc: u8,
    /// Status Code Type (SCT), bits 11:9; see [`sct`]. Three bits.
    pub sct: u8,
    /// Command Retry Delay (CRD), bits 13:12: 0 for no delay, else which of the controller's
    /// CRDT1-3 (identify controller) the host waits before retrying. Two bits.
    pub crd: u8,
    /// More (M), bit 14: the Error Information log page has more about this command.
    pub more: bool,
    /// Do Not Retry (DNR), bit 15: the same command is expected to fail again.
    pub dnr: bool,
}

impl Status {
    /// Successful completion.
    pub const SUCCESS: Status = Status { sc: 0, sct: 0, crd: 0, more: false, dnr: false };

    /// A status of type `sct` and code `sc`, with no retry delay, More or DNR.
    pub const fn new(sct: u8, sc: u8) -> Status {
        Status { sc, sct, crd: 0, more: false, dnr: false }
    }

    /// A Generic Command Status ([`generic`]).
    pub const fn generic(sc: u8) -> Status {
        Status::new(sct::GENERIC, sc)
    }

    /// A Command Specific Status ([`command_specific`], [`fabrics`]).
    pub const fn command_specific(sc: u8) -> Status {
        Status::new(sct::COMMAND_SPECIFIC, sc)
    }

    /// A Media and Data Integrity Error ([`media`]).
    pub const fn media(sc: u8) -> Status {
        Status::new(sct::MEDIA_ERROR, sc)
    }

    /// A Path Related Status ([`path`]).
    pub const fn path(sc: u8) -> Status {
        Status::new(sct::PATH, sc)
    }

    /// The same status with Do Not Retry set.
    pub const fn with_dnr(mut self) -> Status {
        self.dnr = true;
        self
    }

    /// Whether this is Successful Completion (SCT 0, SC 0).
    pub const fn is_success(&self) -> bool {
        self.sct == sct::GENERIC && self.sc == generic::SUCCESS
    }

    /// The 16-bit field as it sits in the completion, with the phase tag in bit 0.
    pub const fn to_field(&self, phase: bool) -> u16 {
        (flag(phase, 0)
            | place(self.sc as u32, 1, 8)
            | place(self.sct as u32, 9, 3)
            | place(self.crd as u32, 12, 2)
            | flag(self.more, 14)
            | flag(self.dnr, 15)) as u16
    }

    /// Splits a 16-bit status field into the status and the phase tag (bit 0).
    pub const fn from_field(field: u16) -> (Status, bool) {
        let v = field as u32;
        let status = Status {
            sc: bits(v, 1, 8) as u8,
            sct: bits(v, 9, 3) as u8,
            crd: bits(v, 12, 2) as u8,
            more: bit(v, 14),
            dnr: bit(v, 15),
        };
        (status, bit(v, 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn field_bits_match_spdk_struct_spdk_nvme_status() {
        // SPDK: uint16_t p:1, sc:8, sct:3, crd:2, m:1, dnr:1 (LSB first).
        assert_eq!(Status::SUCCESS.to_field(true), 0x0001);
        assert_eq!(Status::generic(0xff).to_field(false), 0x01fe);
        assert_eq!(Status::new(7, 0).to_field(false), 0x0e00);
        assert_eq!(Status { crd: 3, ..Status::SUCCESS }.to_field(false), 0x3000);
        assert_eq!(Status { more: true, ..Status::SUCCESS }.to_field(false), 0x4000);
        assert_eq!(Status::SUCCESS.with_dnr().to_field(false), 0x8000);
        // Linux's host reads the field shifted right by one: NVME_SC_INVALID_FIELD (0x2),
        // NVME_SC_CONNECT_INVALID_PARAM (0x182), NVME_STATUS_DNR (0x4000).
        let s = Status::generic(generic::INVALID_FIELD).with_dnr();
        assert_eq!(s.to_field(false) >> 1, 0x4002);
        let s = Status::command_specific(fabrics::CONNECT_INVALID_PARAMETERS);
        assert_eq!(s.to_field(false) >> 1, 0x182);
        assert_eq!(Status::path(path::ASYMMETRIC_ACCESS_INACCESSIBLE).to_field(false) >> 1, 0x302);
    }

    #[test]
    fn success() {
        assert!(Status::SUCCESS.is_success());
        assert!(!Status::generic(generic::INVALID_OPCODE).is_success());
        assert!(!Status::command_specific(0).is_success());
    }

    fn status() -> impl Strategy<Value = Status> {
        (any::<u8>(), 0u8..8, 0u8..4, any::<bool>(), any::<bool>()).prop_map(|(sc, sct, crd, more, dnr)| Status {
            sc,
            sct,
            crd,
            more,
            dnr,
        })
    }

    proptest! {
        #[test]
        fn round_trip(s in status(), p in any::<bool>()) {
            prop_assert_eq!(Status::from_field(s.to_field(p)), (s, p));
        }

        #[test]
        fn any_field_round_trips(f in any::<u16>()) {
            let (s, p) = Status::from_field(f);
            prop_assert_eq!(s.to_field(p), f);
        }
    }
}
