//! The Asynchronous Event Request completion: dword 0 says which event happened and which log
//! page to read to clear it (NVMe Base Specification 2.0 section 5.2.1, figures 146-151; SPDK
//! `union spdk_nvme_async_event_completion`, Linux `NVME_AER_*`).

use super::le::{bits, place};
use super::log::lid;

/// Asynchronous Event Type values (bits 2:0; NVMe 2.0 figure 146).
pub mod event_type {
    /// Error status.
    pub const ERROR: u8 = 0x0;
    /// SMART / Health status.
    pub const SMART: u8 = 0x1;
    /// Notice.
    pub const NOTICE: u8 = 0x2;
    /// Immediate (NVMe 2.0).
    pub const IMMEDIATE: u8 = 0x3;
    /// I/O Command Set specific status.
    pub const IO_COMMAND_SET: u8 = 0x6;
    /// Vendor specific.
    pub const VENDOR_SPECIFIC: u8 = 0x7;
}

/// Asynchronous Event Information values of Notice events (bits 15:8; NVMe 2.0 figure 149,
/// NVMe-oF 1.1 for F0h).
pub mod notice {
    /// Namespace Attribute Changed: read the Changed Namespace List (04h).
    pub const NS_ATTR_CHANGED: u8 = 0x00;
    /// Firmware Activation Starting.
    pub const FW_ACTIVATION_STARTING: u8 = 0x01;
    /// Telemetry Log Changed.
    pub const TELEMETRY_LOG_CHANGED: u8 = 0x02;
    /// Asymmetric Namespace Access Change: read the ANA log (0Ch).
    pub const ANA_CHANGE: u8 = 0x03;
    /// Predictable Latency Event Aggregate Log Change.
    pub const PLEA_CHANGE: u8 = 0x04;
    /// LBA Status Information Alert.
    pub const LBA_STATUS_INFO: u8 = 0x05;
    /// Endurance Group Event Aggregate Log Page Change.
    pub const EGEA_CHANGE: u8 = 0x06;
    /// Discovery Log Page Change: read the Discovery log (70h).
    pub const DISCOVERY_LOG_CHANGE: u8 = 0xf0;
}

/// Asynchronous Event Information values of I/O Command Set events (NVMe 2.0 figure 150).
pub mod io_command_set {
    /// Reservation Log Page Available.
    pub const RESERVATION_LOG_AVAILABLE: u8 = 0x00;
    /// Sanitize Operation Completed.
    pub const SANITIZE_COMPLETED: u8 = 0x01;
}

/// Completion dword 0 of an Asynchronous Event Request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AsyncEvent {
    /// Asynchronous Event Type (bits 2:0); [`event_type`]. Three bits.
    pub event_type: u8,
    /// Asynchronous Event Information (bits 15:8); for notices [`notice`].
    pub info: u8,
    /// Log Page Identifier (bits 23:16) to read to clear the event.
    pub log_page: u8,
}

impl AsyncEvent {
    /// Namespace Attribute Changed (notice 00h, Changed Namespace List log 04h).
    pub const NS_ATTR_CHANGED: AsyncEvent =
        AsyncEvent { event_type: event_type::NOTICE, info: notice::NS_ATTR_CHANGED, log_page: lid::CHANGED_NS_LIST };
    /// ANA Change (notice 03h, ANA log 0Ch).
    pub const ANA_CHANGE: AsyncEvent =
        AsyncEvent { event_type: event_type::NOTICE, info: notice::ANA_CHANGE, log_page: lid::ANA };
    /// Discovery Log Page Change (notice F0h, Discovery log 70h).
    pub const DISCOVERY_LOG_CHANGE: AsyncEvent =
        AsyncEvent { event_type: event_type::NOTICE, info: notice::DISCOVERY_LOG_CHANGE, log_page: lid::DISCOVERY };

    /// The completion's dword 0.
    pub const fn to_dw0(&self) -> u32 {
        place(self.event_type as u32, 0, 3) | (self.info as u32) << 8 | (self.log_page as u32) << 16
    }

    /// The fields of a completion's dword 0; reserved bits are dropped.
    pub const fn from_dw0(v: u32) -> AsyncEvent {
        AsyncEvent { event_type: bits(v, 0, 3) as u8, info: bits(v, 8, 8) as u8, log_page: bits(v, 16, 8) as u8 }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn dw0_matches_spdk_and_linux() {
        // SPDK: async_event_type:3, reserved1:5, async_event_info:8, log_page_identifier:8.
        assert_eq!(AsyncEvent { log_page: 0xff, ..Default::default() }.to_dw0().to_le_bytes(), [0, 0, 0xff, 0]);
        // Linux decodes: type = result & 7, info = (result >> 8) & 0xff; NVME_AER_NOTICE_* values.
        assert_eq!(AsyncEvent::NS_ATTR_CHANGED.to_dw0(), 0x0004_0002);
        assert_eq!(AsyncEvent::ANA_CHANGE.to_dw0(), 0x000c_0302);
        assert_eq!(AsyncEvent::DISCOVERY_LOG_CHANGE.to_dw0(), 0x0070_f002);
        assert_eq!(AsyncEvent::from_dw0(0x000c_0302), AsyncEvent::ANA_CHANGE);
    }

    proptest! {
        #[test]
        fn round_trip(v in any::<u32>()) {
            let e = AsyncEvent::from_dw0(v);
            prop_assert_eq!(e.to_dw0(), v & 0x00ff_ff07);
            prop_assert_eq!(AsyncEvent::from_dw0(e.to_dw0()), e);
        }
    }
}
