//! Feature identifiers and the encodings of their values in Set Features CDW11 and Get
//! Features completion dword 0 (NVMe Base Specification 2.0 section 5.27.1, figures 317-355;
//! SPDK `enum spdk_nvme_feat` and the `spdk_nvme_feat_*` unions).

use super::le::{bit, bits, flag, place};

/// Feature Identifiers (FID; NVMe 2.0 figure 317).
pub mod fid {
    /// Arbitration.
    pub const ARBITRATION: u8 = 0x01;
    /// Power Management.
    pub const POWER_MANAGEMENT: u8 = 0x02;
    /// LBA Range Type.
    pub const LBA_RANGE_TYPE: u8 = 0x03;
    /// Temperature Threshold.
    pub const TEMPERATURE_THRESHOLD: u8 = 0x04;
    /// Error Recovery.
    pub const ERROR_RECOVERY: u8 = 0x05;
    /// Volatile Write Cache.
    pub const VOLATILE_WRITE_CACHE: u8 = 0x06;
    /// Number of Queues.
    pub const NUMBER_OF_QUEUES: u8 = 0x07;
    /// Interrupt Coalescing.
    pub const INTERRUPT_COALESCING: u8 = 0x08;
    /// Interrupt Vector Configuration.
    pub const INTERRUPT_VECTOR_CONFIGURATION: u8 = 0x09;
    /// Write Atomicity Normal.
    pub const WRITE_ATOMICITY: u8 = 0x0a;
    /// Asynchronous Event Configuration.
    pub const ASYNC_EVENT_CONFIGURATION: u8 = 0x0b;
    /// Autonomous Power State Transition.
    pub const AUTONOMOUS_POWER_STATE_TRANSITION: u8 = 0x0c;
    /// Host Memory Buffer.
    pub const HOST_MEM_BUFFER: u8 = 0x0d;
    /// Timestamp.
    pub const TIMESTAMP: u8 = 0x0e;
    /// Keep Alive Timer.
    pub const KEEP_ALIVE_TIMER: u8 = 0x0f;
    /// Host Controlled Thermal Management.
    pub const HOST_CONTROLLED_THERMAL_MANAGEMENT: u8 = 0x10;
    /// Non-Operational Power State Config.
    pub const NON_OPERATIONAL_POWER_STATE_CONFIG: u8 = 0x11;
    /// Host Behavior Support.
    pub const HOST_BEHAVIOR_SUPPORT: u8 = 0x16;
    /// Software Progress Marker.
    pub const SOFTWARE_PROGRESS_MARKER: u8 = 0x80;
    /// Host Identifier.
    pub const HOST_IDENTIFIER: u8 = 0x81;
    /// Reservation Notification Mask.
    pub const RESERVATION_NOTIFICATION_MASK: u8 = 0x82;
    /// Reservation Persistence.
    pub const RESERVATION_PERSISTENCE: u8 = 0x83;
    /// Namespace Write Protection Config.
    pub const NAMESPACE_WRITE_PROTECTION_CONFIG: u8 = 0x84;
}

/// Arbitration (FID 01h; NVMe 2.0 figure 320).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Arbitration {
    /// Arbitration Burst (AB, bits 2:0): 2 ^ AB commands; 7 means no limit. Three bits.
    pub ab: u8,
    /// Low Priority Weight (LPW, bits 15:8), 0-based.
    pub lpw: u8,
    /// Medium Priority Weight (MPW, bits 23:16), 0-based.
    pub mpw: u8,
    /// High Priority Weight (HPW, bits 31:24), 0-based.
    pub hpw: u8,
}

impl Arbitration {
    /// AB value meaning no limit.
    pub const BURST_UNLIMITED: u8 = 7;

    /// The dword value.
    pub const fn to_u32(&self) -> u32 {
        place(self.ab as u32, 0, 3) | (self.lpw as u32) << 8 | (self.mpw as u32) << 16 | (self.hpw as u32) << 24
    }

    /// The fields of a dword.
    pub const fn from_u32(v: u32) -> Arbitration {
        Arbitration { ab: bits(v, 0, 3) as u8, lpw: (v >> 8) as u8, mpw: (v >> 16) as u8, hpw: (v >> 24) as u8 }
    }
}

/// Power Management (FID 02h; NVMe 2.0 figure 322).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PowerManagement {
    /// Power State (PS, bits 4:0). Five bits.
    pub ps: u8,
    /// Workload Hint (WH, bits 7:5). Three bits.
    pub wh: u8,
}

impl PowerManagement {
    /// The dword value.
    pub const fn to_u32(&self) -> u32 {
        place(self.ps as u32, 0, 5) | place(self.wh as u32, 5, 3)
    }

    /// The fields of a dword.
    pub const fn from_u32(v: u32) -> PowerManagement {
        PowerManagement { ps: bits(v, 0, 5) as u8, wh: bits(v, 5, 3) as u8 }
    }
}

/// Temperature Threshold (FID 04h; NVMe 2.0 figure 326).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TemperatureThreshold {
    /// Temperature Threshold (TMPTH, bits 15:0), kelvin.
    pub tmpth: u16,
    /// Threshold Temperature Select (TMPSEL, bits 19:16): 0 composite, 1-8 sensors, Fh all.
    /// Four bits.
    pub tmpsel: u8,
    /// Threshold Type Select (THSEL, bits 21:20): 0 over, 1 under (Linux
    /// `NVME_TEMP_THRESH_TYPE_UNDER` = bit 20). Two bits.
    pub thsel: u8,
}

impl TemperatureThreshold {
    /// THSEL: over temperature threshold.
    pub const OVER: u8 = 0;
    /// THSEL: under temperature threshold.
    pub const UNDER: u8 = 1;

    /// The dword value.
    pub const fn to_u32(&self) -> u32 {
        self.tmpth as u32 | place(self.tmpsel as u32, 16, 4) | place(self.thsel as u32, 20, 2)
    }

    /// The fields of a dword.
    pub const fn from_u32(v: u32) -> TemperatureThreshold {
        TemperatureThreshold { tmpth: v as u16, tmpsel: bits(v, 16, 4) as u8, thsel: bits(v, 20, 2) as u8 }
    }
}

/// Number of Queues (FID 07h; NVMe 2.0 figures 329-330). The same layout carries the request
/// (NSQR/NCQR in CDW11) and the answer (NSQA/NCQA in dword 0); all counts are 0-based and
/// exclude the admin queue. Linux sends count - 1 in both halves and uses
/// `min(NSQA, NCQA) + 1` I/O queues.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct NumberOfQueues {
    /// Number of I/O Submission Queues Requested / Allocated (bits 15:0), 0-based.
    pub nsq: u16,
    /// Number of I/O Completion Queues Requested / Allocated (bits 31:16), 0-based.
    pub ncq: u16,
}

impl NumberOfQueues {
    /// Largest 0-based count; FFFFh in a request is invalid (65536 queues).
    pub const MAX: u16 = 0xfffe;

    /// Requests or grants `sq` submission and `cq` completion queues (1-based counts, at least
    /// 1, at most 65535).
    pub const fn from_counts(sq: u32, cq: u32) -> NumberOfQueues {
        NumberOfQueues { nsq: Self::zero_based(sq), ncq: Self::zero_based(cq) }
    }

    const fn zero_based(n: u32) -> u16 {
        if n == 0 {
            0
        } else if n > 0xffff {
            Self::MAX
        } else {
            (n - 1) as u16
        }
    }

    /// Submission queues, as a count.
    pub const fn sq_count(&self) -> u32 {
        self.nsq as u32 + 1
    }

    /// Completion queues, as a count.
    pub const fn cq_count(&self) -> u32 {
        self.ncq as u32 + 1
    }

    /// The dword value.
    pub const fn to_u32(&self) -> u32 {
        self.nsq as u32 | (self.ncq as u32) << 16
    }

    /// The fields of a dword.
    pub const fn from_u32(v: u32) -> NumberOfQueues {
        NumberOfQueues { nsq: v as u16, ncq: (v >> 16) as u16 }
    }
}

/// Interrupt Coalescing (FID 08h; NVMe 2.0 figure 331). Accepted and kept over fabrics though
/// there are no interrupts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct InterruptCoalescing {
    /// Aggregation Threshold (THR, bits 7:0), 0-based entries.
    pub thr: u8,
    /// Aggregation Time (TIME, bits 15:8), 100 µs units.
    pub time: u8,
}

impl InterruptCoalescing {
    /// The dword value.
    pub const fn to_u32(&self) -> u32 {
        self.thr as u32 | (self.time as u32) << 8
    }

    /// The fields of a dword.
    pub const fn from_u32(v: u32) -> InterruptCoalescing {
        InterruptCoalescing { thr: v as u8, time: (v >> 8) as u8 }
    }
}

/// Volatile Write Cache (FID 06h; NVMe 2.0 figure 328).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct VolatileWriteCache {
    /// Volatile Write Cache Enable (WCE, bit 0).
    pub wce: bool,
}

impl VolatileWriteCache {
    /// The dword value.
    pub const fn to_u32(&self) -> u32 {
        flag(self.wce, 0)
    }

    /// The fields of a dword.
    pub const fn from_u32(v: u32) -> VolatileWriteCache {
        VolatileWriteCache { wce: bit(v, 0) }
    }
}

/// Asynchronous Event Configuration (FID 0Bh; NVMe 2.0 figure 333; SPDK
/// `union spdk_nvme_feat_async_event_configuration`, Linux `NVME_AEN_CFG_*`). Linux enables
/// `OAES & (NS_ATTR | FW_ACT | ANA_CHANGE | DISC_CHANGE)`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AsyncEventConfig {
    /// SMART / Health Critical Warnings (bits 7:0), one per
    /// [`super::log::critical_warning`] bit.
    pub critical_warnings: u8,
    /// Namespace Attribute Notices (bit 8).
    pub ns_attribute: bool,
    /// Firmware Activation Notices (bit 9).
    pub fw_activation: bool,
    /// Telemetry Log Notices (bit 10).
    pub telemetry_log: bool,
    /// Asymmetric Namespace Access Change Notices (bit 11).
    pub ana_change: bool,
    /// Predictable Latency Event Aggregate Log Change Notices (bit 12).
    pub plea_change: bool,
    /// LBA Status Information Notices (bit 13).
    pub lba_status_info: bool,
    /// Endurance Group Event Aggregate Log Change Notices (bit 14).
    pub egea_change: bool,
    /// Normal NVM Subsystem Shutdown Notices (bit 15).
    pub normal_subsystem_shutdown: bool,
    /// Zone Descriptor Changed Notices (bit 27).
    pub zone_descriptor_change: bool,
    /// Discovery Log Page Change Notification (bit 31; NVMe-oF, discovery controllers).
    pub discovery_log_change: bool,
}

impl AsyncEventConfig {
    /// The dword value.
    pub const fn to_u32(&self) -> u32 {
        self.critical_warnings as u32
            | flag(self.ns_attribute, 8)
            | flag(self.fw_activation, 9)
            | flag(self.telemetry_log, 10)
            | flag(self.ana_change, 11)
            | flag(self.plea_change, 12)
            | flag(self.lba_status_info, 13)
            | flag(self.egea_change, 14)
            | flag(self.normal_subsystem_shutdown, 15)
            | flag(self.zone_descriptor_change, 27)
            | flag(self.discovery_log_change, 31)
    }

    /// The fields of a dword; reserved bits are dropped.
    pub const fn from_u32(v: u32) -> AsyncEventConfig {
        AsyncEventConfig {
            critical_warnings: v as u8,
            ns_attribute: bit(v, 8),
            fw_activation: bit(v, 9),
            telemetry_log: bit(v, 10),
            ana_change: bit(v, 11),
            plea_change: bit(v, 12),
            lba_status_info: bit(v, 13),
            egea_change: bit(v, 14),
            normal_subsystem_shutdown: bit(v, 15),
            zone_descriptor_change: bit(v, 27),
            discovery_log_change: bit(v, 31),
        }
    }
}

/// Keep Alive Timer (FID 0Fh; NVMe 2.0 figure 338): Keep Alive Timeout (KATO, CDW11 bits 31:0)
/// in milliseconds, rounded up by the controller to a multiple of Identify Controller KAS;
/// 0 disables the timer. Over fabrics it is first set by Connect's KATO.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct KeepAliveTimer {
    /// Keep Alive Timeout in milliseconds.
    pub kato_ms: u32,
}

impl KeepAliveTimer {
    /// The dword value.
    pub const fn to_u32(&self) -> u32 {
        self.kato_ms
    }

    /// The fields of a dword.
    pub const fn from_u32(v: u32) -> KeepAliveTimer {
        KeepAliveTimer { kato_ms: v }
    }
}

/// Host Identifier (FID 81h; NVMe 2.0 figures 350-351): CDW11 bit 0 Enable Extended Host
/// Identifier (EXHID); the identifier itself travels as data, 16 bytes when EXHID is set, 8
/// otherwise. Over fabrics it must be the 16-byte HOSTID of Connect: SPDK answers Get Features
/// with EXHID clear by Invalid Field, and any Set Features of it by Command Sequence Error.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct HostIdentifier {
    /// Enable Extended Host Identifier (EXHID, CDW11 bit 0): 128-bit identifier.
    pub exhid: bool,
}

impl HostIdentifier {
    /// Bytes of identifier data that go with this CDW11.
    pub const fn data_len(&self) -> usize {
        if self.exhid {
            16
        } else {
            8
        }
    }

    /// The dword value.
    pub const fn to_u32(&self) -> u32 {
        flag(self.exhid, 0)
    }

    /// The fields of a dword.
    pub const fn from_u32(v: u32) -> HostIdentifier {
        HostIdentifier { exhid: bit(v, 0) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn fids_match_spdk_and_linux() {
        assert_eq!(
            [fid::ARBITRATION, fid::POWER_MANAGEMENT, fid::TEMPERATURE_THRESHOLD, fid::VOLATILE_WRITE_CACHE],
            [0x01, 0x02, 0x04, 0x06]
        );
        assert_eq!([fid::NUMBER_OF_QUEUES, fid::INTERRUPT_COALESCING, fid::ASYNC_EVENT_CONFIGURATION], [7, 8, 0x0b]);
        assert_eq!([fid::KEEP_ALIVE_TIMER, fid::HOST_IDENTIFIER], [0x0f, 0x81]);
    }

    #[test]
    fn bits_match_spdk_unions() {
        // spdk_nvme_feat_arbitration: ab:3, reserved:5, lpw:8, mpw:8, hpw:8.
        let a = Arbitration { ab: Arbitration::BURST_UNLIMITED, lpw: 1, mpw: 2, hpw: 3 };
        assert_eq!(a.to_u32(), 0x0302_0107);
        // spdk_nvme_feat_power_management: ps:5, wh:3.
        assert_eq!(PowerManagement { ps: 31, wh: 7 }.to_u32(), 0xff);
        assert_eq!(PowerManagement { ps: 1, wh: 1 }.to_u32(), 0x21);
        // spdk_nvme_feat_temperature_threshold: tmpth:16, tmpsel:4, thsel:2.
        let t = TemperatureThreshold { tmpth: 0x0157, tmpsel: 0xf, thsel: TemperatureThreshold::UNDER };
        assert_eq!(t.to_u32(), 0x001f_0157);
        // spdk_nvme_feat_number_of_queues: nsqr:16, ncqr:16. Linux asks (n-1) | (n-1) << 16.
        let q = NumberOfQueues::from_counts(8, 8);
        assert_eq!(q.to_u32(), 0x0007_0007);
        assert_eq!((q.sq_count(), q.cq_count()), (8, 8));
        assert_eq!(NumberOfQueues::from_counts(0, 70000), NumberOfQueues { nsq: 0, ncq: 0xfffe });
        // spdk_nvme_feat_interrupt_coalescing: thr:8, time:8.
        assert_eq!(InterruptCoalescing { thr: 1, time: 2 }.to_u32(), 0x0201);
        assert_eq!(VolatileWriteCache { wce: true }.to_u32(), 1);
        // spdk_nvme_feat_async_event_configuration: crit_warn:8, ns_attr 8, fw 9, telemetry 10,
        // ana 11, ..., discovery_log_change_notice 31.
        let c = AsyncEventConfig { ns_attribute: true, ana_change: true, ..Default::default() };
        assert_eq!(c.to_u32(), 0x0900);
        let d = AsyncEventConfig { discovery_log_change: true, ..Default::default() };
        assert_eq!(d.to_u32().to_le_bytes(), [0, 0, 0, 0x80]);
        assert_eq!(AsyncEventConfig::from_u32(0x8000_0b1f).critical_warnings, 0x1f);
        assert_eq!(KeepAliveTimer::from_u32(120_000).kato_ms, 120_000);
        assert_eq!(HostIdentifier::from_u32(1), HostIdentifier { exhid: true });
        assert_eq!(HostIdentifier { exhid: true }.data_len(), 16);
        assert_eq!(HostIdentifier::default().data_len(), 8);
    }

    proptest! {
        #[test]
        fn round_trips(v in any::<u32>()) {
            prop_assert_eq!(Arbitration::from_u32(v).to_u32(), v & 0xffff_ff07);
            prop_assert_eq!(PowerManagement::from_u32(v).to_u32(), v & 0xff);
            prop_assert_eq!(TemperatureThreshold::from_u32(v).to_u32(), v & 0x003f_ffff);
            prop_assert_eq!(NumberOfQueues::from_u32(v).to_u32(), v);
            prop_assert_eq!(InterruptCoalescing::from_u32(v).to_u32(), v & 0xffff);
            prop_assert_eq!(VolatileWriteCache::from_u32(v).to_u32(), v & 1);
            prop_assert_eq!(AsyncEventConfig::from_u32(v).to_u32(), v & 0x8800_ffff);
            prop_assert_eq!(KeepAliveTimer::from_u32(v).to_u32(), v);
            prop_assert_eq!(HostIdentifier::from_u32(v).to_u32(), v & 1);
        }
    }
}
