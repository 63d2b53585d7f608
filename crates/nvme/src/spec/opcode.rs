//! Command opcodes (NVMe Base Specification 2.0 figure 138 "Opcodes for Admin Commands",
//! NVM Command Set Specification 1.0 figure 4 "Opcodes for NVM Commands", NVMe over Fabrics 1.1
//! figure 9 "Fabrics Command Opcode"). Bits 1:0 of an opcode give its data direction.

/// Admin command set opcodes.
pub mod admin {
    /// Delete I/O Submission Queue (not used over fabrics).
    pub const DELETE_IO_SQ: u8 = 0x00;
    /// Create I/O Submission Queue (not used over fabrics).
    pub const CREATE_IO_SQ: u8 = 0x01;
    /// Get Log Page.
    pub const GET_LOG_PAGE: u8 = 0x02;
    /// Delete I/O Completion Queue (not used over fabrics).
    pub const DELETE_IO_CQ: u8 = 0x04;
    /// Create I/O Completion Queue (not used over fabrics).
    pub const CREATE_IO_CQ: u8 = 0x05;
    /// Identify.
    pub const IDENTIFY: u8 = 0x06;
    /// Abort.
    pub const ABORT: u8 = 0x08;
    /// Set Features.
    pub const SET_FEATURES: u8 = 0x09;
    /// Get Features.
    pub const GET_FEATURES: u8 = 0x0a;
    /// Asynchronous Event Request.
    pub const ASYNC_EVENT_REQUEST: u8 = 0x0c;
    /// Namespace Management.
    pub const NS_MANAGEMENT: u8 = 0x0d;
    /// Firmware Commit.
    pub const FIRMWARE_COMMIT: u8 = 0x10;
    /// Firmware Image Download.
    pub const FIRMWARE_IMAGE_DOWNLOAD: u8 = 0x11;
    /// Device Self-test.
    pub const DEVICE_SELF_TEST: u8 = 0x14;
    /// Namespace Attachment.
    pub const NS_ATTACHMENT: u8 = 0x15;
    /// Keep Alive.
    pub const KEEP_ALIVE: u8 = 0x18;
    /// Directive Send.
    pub const DIRECTIVE_SEND: u8 = 0x19;
    /// Directive Receive.
    pub const DIRECTIVE_RECEIVE: u8 = 0x1a;
    /// Virtualization Management.
    pub const VIRTUALIZATION_MANAGEMENT: u8 = 0x1c;
    /// NVMe-MI Send.
    pub const NVME_MI_SEND: u8 = 0x1d;
    /// NVMe-MI Receive.
    pub const NVME_MI_RECEIVE: u8 = 0x1e;
    /// Doorbell Buffer Config (not used over fabrics).
    pub const DOORBELL_BUFFER_CONFIG: u8 = 0x7c;
    /// Format NVM.
    pub const FORMAT_NVM: u8 = 0x80;
    /// Security Send.
    pub const SECURITY_SEND: u8 = 0x81;
    /// Security Receive.
    pub const SECURITY_RECEIVE: u8 = 0x82;
    /// Sanitize.
    pub const SANITIZE: u8 = 0x84;
    /// Get LBA Status.
    pub const GET_LBA_STATUS: u8 = 0x86;
    /// First vendor specific admin opcode (C0h-FFh).
    pub const VENDOR_SPECIFIC_START: u8 = 0xc0;
}

/// NVM command set (I/O queue) opcodes.
pub mod nvm {
    /// Flush.
    pub const FLUSH: u8 = 0x00;
    /// Write.
    pub const WRITE: u8 = 0x01;
    /// Read.
    pub const READ: u8 = 0x02;
    /// Write Uncorrectable.
    pub const WRITE_UNCORRECTABLE: u8 = 0x04;
    /// Compare.
    pub const COMPARE: u8 = 0x05;
    /// Write Zeroes.
    pub const WRITE_ZEROES: u8 = 0x08;
    /// Dataset Management.
    pub const DATASET_MANAGEMENT: u8 = 0x09;
    /// Verify.
    pub const VERIFY: u8 = 0x0c;
    /// Reservation Register.
    pub const RESERVATION_REGISTER: u8 = 0x0d;
    /// Reservation Report.
    pub const RESERVATION_REPORT: u8 = 0x0e;
    /// Reservation Acquire.
    pub const RESERVATION_ACQUIRE: u8 = 0x11;
    /// Reservation Release.
    pub const RESERVATION_RELEASE: u8 = 0x15;
    /// Copy.
    pub const COPY: u8 = 0x19;
}

/// The Fabrics command opcode (7Fh) on both admin and I/O queues; the command's FCTYPE (byte 4)
/// says which Fabrics command it is (see [`super::fabrics::fctype`]).
pub const FABRICS: u8 = 0x7f;

/// Data transfer direction of an opcode (bits 1:0; NVMe 2.0 figure 138 note).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataTransfer {
    /// 00b: no data.
    None,
    /// 01b: host to controller (for example Write).
    HostToController,
    /// 10b: controller to host (for example Read).
    ControllerToHost,
    /// 11b: both directions.
    Bidirectional,
}

impl DataTransfer {
    /// The direction that bits 1:0 of `opcode` give. For the Fabrics opcode the direction is
    /// in bits 1:0 of FCTYPE instead: pass the FCTYPE.
    pub const fn of(opcode: u8) -> DataTransfer {
        match opcode & 3 {
            0 => DataTransfer::None,
            1 => DataTransfer::HostToController,
            2 => DataTransfer::ControllerToHost,
            _ => DataTransfer::Bidirectional,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directions() {
        assert_eq!(DataTransfer::of(nvm::WRITE), DataTransfer::HostToController);
        assert_eq!(DataTransfer::of(nvm::READ), DataTransfer::ControllerToHost);
        assert_eq!(DataTransfer::of(nvm::FLUSH), DataTransfer::None);
        assert_eq!(DataTransfer::of(admin::IDENTIFY), DataTransfer::ControllerToHost);
        assert_eq!(DataTransfer::of(admin::SET_FEATURES), DataTransfer::HostToController);
        assert_eq!(DataTransfer::of(FABRICS), DataTransfer::Bidirectional);
        // Connect (FCTYPE 01h) sends data; Property Get (04h) and Set (00h) carry none.
        assert_eq!(DataTransfer::of(0x01), DataTransfer::HostToController);
    }
}
