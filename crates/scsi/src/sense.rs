//! Why a command failed, and the sense data that says so: a [`Fault`] (the bdev layer's
//! [`Sense`] with what SPC-4 adds: the INFORMATION field and the sense-key specific field
//! pointer), encoded in fixed format (70h) or descriptor format (72h, when the control mode
//! page's D_SENSE is set) into a [`SenseBuf`] that lives inline in the response (no allocation).

pub use ferrite_bdev::translate::codes::scsi::*;
pub use ferrite_bdev::translate::Sense;

/// Additional sense codes (and qualifiers) the bdev layer's table does not name (SPC-4
/// annex D), as (ASC, ASCQ).
pub mod asc {
    /// NO ADDITIONAL SENSE INFORMATION.
    pub const NO_ADDITIONAL_SENSE: (u8, u8) = (0x00, 0x00);
    /// LOGICAL UNIT NOT READY, CAUSE NOT REPORTABLE.
    pub const NOT_READY: (u8, u8) = (0x04, 0x00);
    /// LOGICAL UNIT NOT READY, INITIALIZING COMMAND REQUIRED (stopped by START STOP UNIT).
    pub const NOT_READY_INIT_REQUIRED: (u8, u8) = (0x04, 0x02);
    /// INVALID FIELD IN COMMAND INFORMATION UNIT (the transport's length disagrees).
    pub const INVALID_FIELD_IN_CMD_IU: (u8, u8) = (0x0e, 0x03);
    /// MISCOMPARE DURING VERIFY OPERATION.
    pub const MISCOMPARE: (u8, u8) = (0x1d, 0x00);
    /// PARAMETER LIST LENGTH ERROR.
    pub const PARAMETER_LIST_LENGTH_ERROR: (u8, u8) = (0x1a, 0x00);
    /// INVALID COMMAND OPERATION CODE.
    pub const INVALID_OPCODE: (u8, u8) = (0x20, 0x00);
    /// LOGICAL BLOCK ADDRESS OUT OF RANGE.
    pub const LBA_OUT_OF_RANGE: (u8, u8) = (0x21, 0x00);
    /// INVALID FIELD IN CDB.
    pub const INVALID_FIELD_IN_CDB: (u8, u8) = (0x24, 0x00);
    /// LOGICAL UNIT NOT SUPPORTED.
    pub const LUN_NOT_SUPPORTED: (u8, u8) = (0x25, 0x00);
    /// INVALID FIELD IN PARAMETER LIST.
    pub const INVALID_FIELD_IN_PARAMETER_LIST: (u8, u8) = (0x26, 0x00);
    /// PARAMETER VALUE INVALID.
    pub const PARAMETER_VALUE_INVALID: (u8, u8) = (0x26, 0x02);
    /// INVALID RELEASE OF PERSISTENT RESERVATION.
    pub const INVALID_RELEASE_OF_PR: (u8, u8) = (0x26, 0x04);
    /// WRITE PROTECTED.
    pub const WRITE_PROTECTED: (u8, u8) = (0x27, 0x00);
    /// POWER ON, RESET, OR BUS DEVICE RESET OCCURRED.
    pub const POWER_ON_RESET: (u8, u8) = (0x29, 0x00);
    /// POWER ON OCCURRED.
    pub const POWER_ON: (u8, u8) = (0x29, 0x01);
    /// BUS DEVICE RESET FUNCTION OCCURRED (a logical unit reset).
    pub const BUS_DEVICE_RESET: (u8, u8) = (0x29, 0x03);
    /// I_T NEXUS LOSS OCCURRED.
    pub const I_T_NEXUS_LOSS: (u8, u8) = (0x29, 0x07);
    /// MODE PARAMETERS CHANGED.
    pub const MODE_PARAMETERS_CHANGED: (u8, u8) = (0x2a, 0x01);
    /// RESERVATIONS PREEMPTED.
    pub const RESERVATIONS_PREEMPTED: (u8, u8) = (0x2a, 0x03);
    /// RESERVATIONS RELEASED.
    pub const RESERVATIONS_RELEASED: (u8, u8) = (0x2a, 0x04);
    /// REGISTRATIONS PREEMPTED.
    pub const REGISTRATIONS_PREEMPTED: (u8, u8) = (0x2a, 0x05);
    /// CAPACITY DATA HAS CHANGED.
    pub const CAPACITY_DATA_CHANGED: (u8, u8) = (0x2a, 0x09);
    /// COMMAND SEQUENCE ERROR.
    pub const COMMAND_SEQUENCE_ERROR: (u8, u8) = (0x2c, 0x00);
    /// SAVING PARAMETERS NOT SUPPORTED.
    pub const SAVING_PARAMETERS_NOT_SUPPORTED: (u8, u8) = (0x39, 0x00);
    /// REPORTED LUNS DATA HAS CHANGED.
    pub const REPORTED_LUNS_DATA_CHANGED: (u8, u8) = (0x3f, 0x0e);
    /// INTERNAL TARGET FAILURE.
    pub const INTERNAL_TARGET_FAILURE: (u8, u8) = (0x44, 0x00);
    /// INSUFFICIENT REGISTRATION RESOURCES.
    pub const INSUFFICIENT_REGISTRATION_RESOURCES: (u8, u8) = (0x55, 0x04);
}

/// The sense-key specific field of ILLEGAL REQUEST (SPC-4 4.5.2.4.2): which byte (and bit) of
/// the CDB or of the parameter list is wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldPointer {
    /// The CDB (true) or the parameter list (false).
    pub in_cdb: bool,
    /// The byte.
    pub byte: u16,
    /// The bit (the field's most significant one), if it is told.
    pub bit: Option<u8>,
}

impl FieldPointer {
    /// The three sense-key specific bytes: SKSV, C/D, BPV and bit pointer, field pointer.
    pub fn bytes(self) -> [u8; 3] {
        let mut b0 = 0x80 | if self.in_cdb { 0x40 } else { 0 };
        if let Some(bit) = self.bit {
            b0 |= 0x08 | (bit & 7);
        }
        let [hi, lo] = self.byte.to_be_bytes();
        [b0, hi, lo]
    }
}

/// A command's failure: status with sense key, ASC and ASCQ, and the optional INFORMATION and
/// field pointer of the sense data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fault {
    /// Status, key, ASC, ASCQ.
    pub sense: Sense,
    /// The INFORMATION field (a miscompare's offset, an LBA), if valid.
    pub info: Option<u64>,
    /// The sense-key specific field pointer, if any.
    pub field: Option<FieldPointer>,
}

impl Fault {
    /// CHECK CONDITION with `key` and `(asc, ascq)`.
    pub const fn check(key: u8, (asc, ascq): (u8, u8)) -> Fault {
        Fault { sense: Sense::check(key, asc, ascq), info: None, field: None }
    }

    /// ILLEGAL REQUEST, INVALID COMMAND OPERATION CODE.
    pub const fn invalid_opcode() -> Fault {
        Fault::check(SENSE_ILLEGAL_REQUEST, asc::INVALID_OPCODE)
    }

    /// ILLEGAL REQUEST, INVALID FIELD IN CDB, pointing at `byte` (and `bit`).
    pub const fn invalid_cdb(byte: u16, bit: Option<u8>) -> Fault {
        let mut f = Fault::check(SENSE_ILLEGAL_REQUEST, asc::INVALID_FIELD_IN_CDB);
        f.field = Some(FieldPointer { in_cdb: true, byte, bit });
        f
    }

    /// ILLEGAL REQUEST, INVALID FIELD IN PARAMETER LIST, pointing at `byte` (and `bit`) of
    /// the parameter data.
    pub const fn invalid_param(byte: u16, bit: Option<u8>) -> Fault {
        let mut f = Fault::check(SENSE_ILLEGAL_REQUEST, asc::INVALID_FIELD_IN_PARAMETER_LIST);
        f.field = Some(FieldPointer { in_cdb: false, byte, bit });
        f
    }

    /// ILLEGAL REQUEST, PARAMETER LIST LENGTH ERROR.
    pub const fn param_list_length() -> Fault {
        Fault::check(SENSE_ILLEGAL_REQUEST, asc::PARAMETER_LIST_LENGTH_ERROR)
    }

    /// ILLEGAL REQUEST, LOGICAL BLOCK ADDRESS OUT OF RANGE.
    pub const fn lba_out_of_range() -> Fault {
        Fault::check(SENSE_ILLEGAL_REQUEST, asc::LBA_OUT_OF_RANGE)
    }

    /// RESERVATION CONFLICT (no sense data).
    pub const fn reservation_conflict() -> Fault {
        Fault { sense: Sense { status: STATUS_RESERVATION_CONFLICT, key: 0, asc: 0, ascq: 0 }, info: None, field: None }
    }

    /// The same fault with INFORMATION `v`.
    pub const fn with_info(mut self, v: u64) -> Fault {
        self.info = Some(v);
        self
    }

    /// The fault for a bdev status (`ferrite_bdev::translate::scsi_of`), a miscompare's
    /// offset as INFORMATION.
    pub fn of_io(s: ferrite_bdev::IoStatus) -> Fault {
        let sense = ferrite_bdev::translate::scsi_of(s);
        let info = match s {
            ferrite_bdev::IoStatus::Miscompare { offset } => offset.get(),
            _ => None,
        };
        Fault { sense, info, field: None }
    }

    /// True for statuses that carry sense data (CHECK CONDITION).
    pub fn has_sense(&self) -> bool {
        self.sense.status == STATUS_CHECK_CONDITION
    }

    /// The sense data in fixed (`descriptor` false) or descriptor format.
    pub fn encode(&self, descriptor: bool) -> SenseBuf {
        if descriptor {
            self.encode_descriptor()
        } else {
            self.encode_fixed()
        }
    }

    fn encode_fixed(&self) -> SenseBuf {
        let mut b = SenseBuf::default();
        let d = &mut b.bytes;
        d[0] = 0x70;
        d[2] = self.sense.key & 0x0f;
        // INFORMATION is four bytes in fixed format: VALID only when the value fits.
        if let Some(v) = self.info.and_then(|v| u32::try_from(v).ok()) {
            d[0] |= 0x80;
            d[3..7].copy_from_slice(&v.to_be_bytes());
        }
        d[7] = 10;
        d[12] = self.sense.asc;
        d[13] = self.sense.ascq;
        if let Some(f) = self.field {
            d[15..18].copy_from_slice(&f.bytes());
        }
        b.len = 18;
        b
    }

    fn encode_descriptor(&self) -> SenseBuf {
        let mut b = SenseBuf::default();
        let d = &mut b.bytes;
        d[0] = 0x72;
        d[1] = self.sense.key & 0x0f;
        d[2] = self.sense.asc;
        d[3] = self.sense.ascq;
        let mut n = 8;
        if let Some(v) = self.info {
            // Information descriptor (00h): VALID, eight bytes.
            d[n..n + 4].copy_from_slice(&[0x00, 0x0a, 0x80, 0]);
            d[n + 4..n + 12].copy_from_slice(&v.to_be_bytes());
            n += 12;
        }
        if let Some(f) = self.field {
            // Sense key specific descriptor (02h).
            d[n..n + 4].copy_from_slice(&[0x02, 0x06, 0, 0]);
            d[n + 4..n + 7].copy_from_slice(&f.bytes());
            n += 8;
        }
        d[7] = (n - 8) as u8;
        b.len = n as u8;
        b
    }
}

/// Sense data, inline: at most 28 bytes are ever built (descriptor format with both
/// descriptors).
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct SenseBuf {
    bytes: [u8; 32],
    len: u8,
}

impl SenseBuf {
    /// The sense bytes (empty when there is no sense data).
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// True when there is no sense data.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl std::fmt::Debug for SenseBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SenseBuf({:02x?})", self.as_slice())
    }
}

/// Key, ASC and ASCQ read back from sense data of either format (for tests and logs).
pub fn parse(sense: &[u8]) -> Option<(u8, u8, u8)> {
    match sense.first()? & 0x7f {
        0x70 | 0x71 if sense.len() >= 14 => Some((sense[2] & 0x0f, sense[12], sense[13])),
        0x72 | 0x73 if sense.len() >= 4 => Some((sense[1] & 0x0f, sense[2], sense[3])),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_format_carries_information_and_the_field_pointer() {
        let f = Fault::invalid_cdb(2, Some(7)).with_info(0x1234);
        let s = f.encode(false);
        let b = s.as_slice();
        assert_eq!(b.len(), 18);
        assert_eq!(b[0], 0xf0, "VALID and current fixed format");
        assert_eq!(&b[3..7], &[0, 0, 0x12, 0x34]);
        assert_eq!((b[2], b[7], b[12], b[13]), (5, 10, 0x24, 0));
        assert_eq!(&b[15..18], &[0xcf, 0, 2], "SKSV, C/D, BPV, bit 7, byte 2");
        assert_eq!(parse(b), Some((5, 0x24, 0)));
    }

    #[test]
    fn descriptor_format_carries_both_descriptors() {
        let f = Fault::invalid_param(300, None).with_info(1 << 40);
        let s = f.encode(true);
        let b = s.as_slice();
        assert_eq!((b[0], b[1], b[2], b[3], b[7]), (0x72, 5, 0x26, 0, 20));
        assert_eq!(&b[8..12], &[0, 0x0a, 0x80, 0]);
        assert_eq!(u64::from_be_bytes(b[12..20].try_into().unwrap()), 1 << 40);
        assert_eq!(&b[20..27], &[2, 6, 0, 0, 0x80, 1, 44]);
        assert_eq!(parse(b), Some((5, 0x26, 0)));
    }

    #[test]
    fn a_large_information_value_is_not_valid_in_fixed_format() {
        let s = Fault::lba_out_of_range().with_info(u64::MAX).encode(false);
        assert_eq!(s.as_slice()[0], 0x70);
    }
}
