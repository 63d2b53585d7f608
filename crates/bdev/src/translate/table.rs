//! NVMe status <-> SCSI status and sense.
//!
//! NVMe to SCSI is SPDK's `spdk_scsi_nvme_translate` (lib/bdev/scsi_nvme.c), row for row: every
//! case it lists is a row here, the ones it sends to its `default` too, and what it does not list
//! falls to the same per-type default (ILLEGAL REQUEST, no additional sense).
//!
//! SCSI to NVMe is its inverse, as the NVM Express SCSI Translation Reference pairs them: a
//! sense that one NVMe status alone translates to goes back to that status; a sense that
//! several translate to goes back to the most general of them, and WRITE PROTECTED to the
//! status for a whole write-protected namespace (named in [`REVERSE_CHOICES`]);
//! what SPDK's table never produces goes back by sense key ([`scsi_to_nvme`]). With no match
//! at all (UNIT ATTENTION, ACA ACTIVE, a vendor key) the answer is Internal Error without Do
//! Not Retry: the command may pass later.

use super::codes::nvme::{command_specific as cs, generic as g, media as m};
use super::codes::nvme::{SCT_COMMAND_SPECIFIC, SCT_GENERIC, SCT_MEDIA_ERROR};
use super::codes::scsi::*;
use super::{NvmeStatus, Sense};

const fn check(key: u8, asc: u8, ascq: u8) -> Sense {
    Sense { status: STATUS_CHECK_CONDITION, key, asc, ascq }
}

/// GOOD, no sense.
const GOOD: Sense = Sense { status: STATUS_GOOD, key: SENSE_NO_SENSE, asc: 0, ascq: 0 };
/// SPDK's default for every status it does not list: ILLEGAL REQUEST, no additional sense.
const OTHER: Sense = check(SENSE_ILLEGAL_REQUEST, ASC_NO_ADDITIONAL_SENSE, ASCQ_CAUSE_NOT_REPORTABLE);
const ABORTED: Sense = Sense {
    status: STATUS_TASK_ABORTED,
    key: SENSE_ABORTED_COMMAND,
    asc: ASC_NO_ADDITIONAL_SENSE,
    ascq: ASCQ_CAUSE_NOT_REPORTABLE,
};
const MEDIUM: Sense = check(SENSE_MEDIUM_ERROR, ASC_NO_ADDITIONAL_SENSE, ASCQ_CAUSE_NOT_REPORTABLE);
const INVALID_FIELD: Sense = check(SENSE_ILLEGAL_REQUEST, ASC_INVALID_FIELD_IN_CDB, ASCQ_CAUSE_NOT_REPORTABLE);

/// SPDK's table: (SCT, SC, what it translates to), in SPDK's order.
pub const NVME_TO_SCSI: &[(u8, u8, Sense)] = &[
    (SCT_GENERIC, g::SUCCESS, GOOD),
    (SCT_GENERIC, g::INVALID_OPCODE, check(SENSE_ILLEGAL_REQUEST, ASC_INVALID_COMMAND_OPERATION_CODE, 0)),
    (SCT_GENERIC, g::INVALID_FIELD, INVALID_FIELD),
    (SCT_GENERIC, g::DATA_TRANSFER_ERROR, MEDIUM),
    (SCT_GENERIC, g::CAPACITY_EXCEEDED, MEDIUM),
    (
        SCT_GENERIC,
        g::ABORTED_POWER_LOSS,
        Sense {
            status: STATUS_TASK_ABORTED,
            key: SENSE_ABORTED_COMMAND,
            asc: ASC_WARNING,
            ascq: ASCQ_POWER_LOSS_EXPECTED,
        },
    ),
    (SCT_GENERIC, g::INTERNAL_DEVICE_ERROR, check(SENSE_HARDWARE_ERROR, ASC_INTERNAL_TARGET_FAILURE, 0)),
    (SCT_GENERIC, g::ABORTED_BY_REQUEST, ABORTED),
    (SCT_GENERIC, g::ABORTED_SQ_DELETION, ABORTED),
    (SCT_GENERIC, g::ABORTED_FAILED_FUSED, ABORTED),
    (SCT_GENERIC, g::ABORTED_MISSING_FUSED, ABORTED),
    (
        SCT_GENERIC,
        g::INVALID_NAMESPACE_OR_FORMAT,
        check(SENSE_ILLEGAL_REQUEST, ASC_ACCESS_DENIED, ASCQ_INVALID_LU_IDENTIFIER),
    ),
    (SCT_GENERIC, g::LBA_OUT_OF_RANGE, check(SENSE_ILLEGAL_REQUEST, ASC_LOGICAL_BLOCK_ADDRESS_OUT_OF_RANGE, 0)),
    (SCT_GENERIC, g::NAMESPACE_NOT_READY, check(SENSE_NOT_READY, ASC_LOGICAL_UNIT_NOT_READY, 0)),
    (
        SCT_GENERIC,
        g::RESERVATION_CONFLICT,
        Sense { status: STATUS_RESERVATION_CONFLICT, key: SENSE_NO_SENSE, asc: 0, ascq: 0 },
    ),
    (SCT_GENERIC, g::COMMAND_ID_CONFLICT, OTHER),
    (SCT_GENERIC, g::COMMAND_SEQUENCE_ERROR, OTHER),
    (SCT_GENERIC, g::INVALID_SGL_SEG_DESCRIPTOR, OTHER),
    (SCT_GENERIC, g::INVALID_NUM_SGL_DESCRIPTORS, OTHER),
    (SCT_GENERIC, g::DATA_SGL_LENGTH_INVALID, OTHER),
    (SCT_GENERIC, g::METADATA_SGL_LENGTH_INVALID, OTHER),
    (SCT_GENERIC, g::SGL_DESCRIPTOR_TYPE_INVALID, OTHER),
    (SCT_GENERIC, g::INVALID_CONTROLLER_MEM_BUF, OTHER),
    (SCT_GENERIC, g::INVALID_PRP_OFFSET, OTHER),
    (SCT_GENERIC, g::ATOMIC_WRITE_UNIT_EXCEEDED, OTHER),
    (SCT_GENERIC, g::INVALID_SGL_OFFSET, OTHER),
    (SCT_GENERIC, g::HOSTID_INCONSISTENT_FORMAT, OTHER),
    (SCT_GENERIC, g::KEEP_ALIVE_EXPIRED, OTHER),
    (SCT_GENERIC, g::KEEP_ALIVE_INVALID, OTHER),
    (SCT_GENERIC, g::FORMAT_IN_PROGRESS, OTHER),
    (SCT_COMMAND_SPECIFIC, cs::COMPLETION_QUEUE_INVALID, OTHER),
    (SCT_COMMAND_SPECIFIC, cs::ABORT_COMMAND_LIMIT_EXCEEDED, OTHER),
    (
        SCT_COMMAND_SPECIFIC,
        cs::INVALID_FORMAT,
        check(SENSE_ILLEGAL_REQUEST, ASC_FORMAT_COMMAND_FAILED, ASCQ_FORMAT_COMMAND_FAILED),
    ),
    (SCT_COMMAND_SPECIFIC, cs::CONFLICTING_ATTRIBUTES, INVALID_FIELD),
    (SCT_COMMAND_SPECIFIC, cs::ATTEMPTED_WRITE_TO_RO_RANGE, check(SENSE_DATA_PROTECT, ASC_WRITE_PROTECTED, 0)),
    (SCT_COMMAND_SPECIFIC, cs::INVALID_QUEUE_IDENTIFIER, OTHER),
    (SCT_COMMAND_SPECIFIC, cs::INVALID_QUEUE_SIZE, OTHER),
    (SCT_COMMAND_SPECIFIC, cs::ASYNC_EVENT_REQUEST_LIMIT_EXCEEDED, OTHER),
    (SCT_COMMAND_SPECIFIC, cs::INVALID_FIRMWARE_SLOT, OTHER),
    (SCT_COMMAND_SPECIFIC, cs::INVALID_FIRMWARE_IMAGE, OTHER),
    (SCT_COMMAND_SPECIFIC, cs::INVALID_INTERRUPT_VECTOR, OTHER),
    (SCT_COMMAND_SPECIFIC, cs::INVALID_LOG_PAGE, OTHER),
    (SCT_COMMAND_SPECIFIC, cs::FIRMWARE_REQ_CONVENTIONAL_RESET, OTHER),
    (SCT_COMMAND_SPECIFIC, cs::INVALID_QUEUE_DELETION, OTHER),
    (SCT_COMMAND_SPECIFIC, cs::FEATURE_ID_NOT_SAVEABLE, OTHER),
    (SCT_COMMAND_SPECIFIC, cs::FEATURE_NOT_CHANGEABLE, OTHER),
    (SCT_COMMAND_SPECIFIC, cs::FEATURE_NOT_NAMESPACE_SPECIFIC, OTHER),
    (SCT_COMMAND_SPECIFIC, cs::FIRMWARE_REQ_NVM_RESET, OTHER),
    (SCT_COMMAND_SPECIFIC, cs::FIRMWARE_REQ_RESET, OTHER),
    (SCT_COMMAND_SPECIFIC, cs::FIRMWARE_REQ_MAX_TIME_VIOLATION, OTHER),
    (SCT_COMMAND_SPECIFIC, cs::FIRMWARE_ACTIVATION_PROHIBITED, OTHER),
    (SCT_COMMAND_SPECIFIC, cs::OVERLAPPING_RANGE, OTHER),
    (SCT_COMMAND_SPECIFIC, cs::NAMESPACE_INSUFFICIENT_CAPACITY, OTHER),
    (SCT_COMMAND_SPECIFIC, cs::NAMESPACE_ID_UNAVAILABLE, OTHER),
    (SCT_COMMAND_SPECIFIC, cs::NAMESPACE_ALREADY_ATTACHED, OTHER),
    (SCT_COMMAND_SPECIFIC, cs::NAMESPACE_IS_PRIVATE, OTHER),
    (SCT_COMMAND_SPECIFIC, cs::NAMESPACE_NOT_ATTACHED, OTHER),
    (SCT_COMMAND_SPECIFIC, cs::THIN_PROVISIONING_NOT_SUPPORTED, OTHER),
    (SCT_COMMAND_SPECIFIC, cs::CONTROLLER_LIST_INVALID, OTHER),
    (SCT_COMMAND_SPECIFIC, cs::INVALID_PROTECTION_INFO, OTHER),
    (SCT_MEDIA_ERROR, m::WRITE_FAULT, check(SENSE_MEDIUM_ERROR, ASC_PERIPHERAL_DEVICE_WRITE_FAULT, 0)),
    (SCT_MEDIA_ERROR, m::UNRECOVERED_READ_ERROR, check(SENSE_MEDIUM_ERROR, ASC_UNRECOVERED_READ_ERROR, 0)),
    (
        SCT_MEDIA_ERROR,
        m::GUARD_CHECK_ERROR,
        check(SENSE_MEDIUM_ERROR, ASC_LOGICAL_BLOCK_PI_CHECK_FAILED, ASCQ_LOGICAL_BLOCK_GUARD_CHECK_FAILED),
    ),
    (
        SCT_MEDIA_ERROR,
        m::APPLICATION_TAG_CHECK_ERROR,
        check(SENSE_MEDIUM_ERROR, ASC_LOGICAL_BLOCK_PI_CHECK_FAILED, ASCQ_LOGICAL_BLOCK_APP_TAG_CHECK_FAILED),
    ),
    (
        SCT_MEDIA_ERROR,
        m::REFERENCE_TAG_CHECK_ERROR,
        check(SENSE_MEDIUM_ERROR, ASC_LOGICAL_BLOCK_PI_CHECK_FAILED, ASCQ_LOGICAL_BLOCK_REF_TAG_CHECK_FAILED),
    ),
    (SCT_MEDIA_ERROR, m::COMPARE_FAILURE, check(SENSE_MISCOMPARE, ASC_MISCOMPARE_DURING_VERIFY_OPERATION, 0)),
    (SCT_MEDIA_ERROR, m::ACCESS_DENIED, check(SENSE_DATA_PROTECT, ASC_ACCESS_DENIED, ASCQ_NO_ACCESS_RIGHTS)),
    (SCT_MEDIA_ERROR, m::DEALLOCATED_OR_UNWRITTEN_BLOCK, OTHER),
];

/// The SCSI status and sense for an NVMe status (SPDK's `spdk_scsi_nvme_translate`).
pub fn nvme_to_scsi(sct: u8, sc: u8) -> Sense {
    // Errors only: a linear scan of some 70 rows, not on any success path.
    NVME_TO_SCSI.iter().find(|(t, c, _)| *t == sct && *c == sc).map_or(OTHER, |(_, _, s)| *s)
}

/// Senses that several NVMe statuses translate to, and the one each goes back to.
pub const REVERSE_CHOICES: &[(Sense, u8, u8)] = &[
    // Data Transfer Error and Capacity Exceeded: the general one (a full volume the layer
    // reports itself as SPACE ALLOCATION FAILED WRITE PROTECT).
    (MEDIUM, SCT_GENERIC, g::DATA_TRANSFER_ERROR),
    // The four aborts: Command Abort Requested.
    (ABORTED, SCT_GENERIC, g::ABORTED_BY_REQUEST),
    // Invalid Field and Conflicting Attributes: Invalid Field.
    (INVALID_FIELD, SCT_GENERIC, g::INVALID_FIELD),
    // WRITE PROTECTED, which SPDK gives Attempted Write to Read Only Range: a SCSI device
    // protects the whole logical unit, as Namespace Is Write Protected says (and as Ferrite's
    // read-only volumes answer through NVMe). SPDK's table has no row for that status.
    (check(SENSE_DATA_PROTECT, ASC_WRITE_PROTECTED, 0), SCT_GENERIC, g::NAMESPACE_IS_WRITE_PROTECTED),
];

/// The NVMe status for a SCSI status and sense (see the module's comment). Do Not Retry is set
/// where a retry cannot change the outcome: ILLEGAL REQUEST, DATA PROTECT, MISCOMPARE,
/// RESERVATION CONFLICT.
pub fn scsi_to_nvme(s: Sense) -> NvmeStatus {
    let code = |sct: u8, sc: u8| NvmeStatus { sct, sc, dnr: permanent(s) };
    match s.status {
        STATUS_GOOD | STATUS_CHECK_CONDITION | STATUS_TASK_ABORTED => {}
        STATUS_RESERVATION_CONFLICT => return code(SCT_GENERIC, g::RESERVATION_CONFLICT),
        // The target is busy for now: the host may retry.
        STATUS_BUSY | STATUS_TASK_SET_FULL => return code(SCT_GENERIC, g::COMMAND_INTERRUPTED),
        _ => return code(SCT_GENERIC, g::INTERNAL_DEVICE_ERROR),
    }
    if s.status == STATUS_GOOD {
        return code(SCT_GENERIC, g::SUCCESS);
    }
    if let Some((_, sct, sc)) = REVERSE_CHOICES.iter().find(|(r, _, _)| *r == s) {
        return code(*sct, *sc);
    }
    let mut rows = NVME_TO_SCSI.iter().filter(|(_, _, r)| *r == s && *r != OTHER);
    if let (Some((sct, sc, _)), None) = (rows.next(), rows.next()) {
        return code(*sct, *sc);
    }
    match (s.key, s.asc, s.ascq) {
        (SENSE_DATA_PROTECT, ASC_WRITE_PROTECTED, ASCQ_SPACE_ALLOCATION_FAILED_WRITE_PROTECT) => {
            code(SCT_GENERIC, g::CAPACITY_EXCEEDED)
        }
        // The whole logical unit write-protected (a read-only volume).
        (SENSE_DATA_PROTECT, ASC_WRITE_PROTECTED, _) => code(SCT_GENERIC, g::NAMESPACE_IS_WRITE_PROTECTED),
        (SENSE_DATA_PROTECT, _, _) => code(SCT_MEDIA_ERROR, m::ACCESS_DENIED),
        (SENSE_ILLEGAL_REQUEST, ASC_LOGICAL_UNIT_NOT_SUPPORTED, _) => code(SCT_GENERIC, g::INVALID_NAMESPACE_OR_FORMAT),
        (SENSE_ILLEGAL_REQUEST, _, _) => code(SCT_GENERIC, g::INVALID_FIELD),
        (SENSE_NOT_READY, _, _) => code(SCT_GENERIC, g::NAMESPACE_NOT_READY),
        (SENSE_MEDIUM_ERROR, ASC_UNRECOVERED_READ_ERROR, _) => code(SCT_MEDIA_ERROR, m::UNRECOVERED_READ_ERROR),
        (SENSE_MEDIUM_ERROR, _, _) => code(SCT_GENERIC, g::DATA_TRANSFER_ERROR),
        (SENSE_MISCOMPARE, _, _) => code(SCT_MEDIA_ERROR, m::COMPARE_FAILURE),
        (SENSE_ABORTED_COMMAND, _, _) => code(SCT_GENERIC, g::ABORTED_BY_REQUEST),
        // HARDWARE ERROR, and what has no match (UNIT ATTENTION, RECOVERED ERROR or NO SENSE
        // under CHECK CONDITION, vendor keys).
        _ => code(SCT_GENERIC, g::INTERNAL_DEVICE_ERROR),
    }
}

fn permanent(s: Sense) -> bool {
    s.status == STATUS_RESERVATION_CONFLICT
        || s.status == STATUS_CHECK_CONDITION
            && matches!(s.key, SENSE_ILLEGAL_REQUEST | SENSE_DATA_PROTECT | SENSE_MISCOMPARE)
}
