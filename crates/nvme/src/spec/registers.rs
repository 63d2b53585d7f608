//! Controller registers, which fabrics controllers expose as properties read and written with
//! Property Get/Set (NVMe Base Specification 2.0, section 3.1.3 "Controller Properties", figure
//! 35; SPDK `struct spdk_nvme_registers` and the `spdk_nvme_*_register` unions).

use super::le::{bit, bits, flag, place};

/// Property offsets (SPDK's `SPDK_STATIC_ASSERT(... == offsetof(struct spdk_nvme_registers,
/// ...))`; Linux `NVME_REG_*`). Over fabrics, INTMS/INTMC, the admin queue and the memory buffer
/// registers are reserved (NVMe 2.0 figure 35), though SPDK's target still answers AQA, ASQ and
/// ACQ.
pub mod offset {
    /// Controller Capabilities (8 bytes).
    pub const CAP: u32 = 0x00;
    /// Version (4 bytes).
    pub const VS: u32 = 0x08;
    /// Interrupt Mask Set (PCIe only).
    pub const INTMS: u32 = 0x0c;
    /// Interrupt Mask Clear (PCIe only).
    pub const INTMC: u32 = 0x10;
    /// Controller Configuration (4 bytes).
    pub const CC: u32 = 0x14;
    /// Controller Status (4 bytes).
    pub const CSTS: u32 = 0x1c;
    /// NVM Subsystem Reset (4 bytes, optional).
    pub const NSSR: u32 = 0x20;
    /// Admin Queue Attributes (PCIe).
    pub const AQA: u32 = 0x24;
    /// Admin Submission Queue Base Address (PCIe, 8 bytes).
    pub const ASQ: u32 = 0x28;
    /// Admin Completion Queue Base Address (PCIe, 8 bytes).
    pub const ACQ: u32 = 0x30;
    /// Controller Memory Buffer Location.
    pub const CMBLOC: u32 = 0x38;
    /// Controller Memory Buffer Size.
    pub const CMBSZ: u32 = 0x3c;
    /// Boot Partition Information.
    pub const BPINFO: u32 = 0x40;
    /// Boot Partition Read Select.
    pub const BPRSEL: u32 = 0x44;
    /// Boot Partition Memory Buffer Location (8 bytes).
    pub const BPMBL: u32 = 0x48;
    /// Controller Memory Buffer Memory Space Control (8 bytes).
    pub const CMBMSC: u32 = 0x50;
    /// Controller Memory Buffer Status.
    pub const CMBSTS: u32 = 0x58;
    /// Controller Memory Buffer Elasticity Buffer Size.
    pub const CMBEBS: u32 = 0x5c;
    /// Controller Memory Buffer Sustained Write Throughput.
    pub const CMBSWTP: u32 = 0x60;
    /// NVM Subsystem Shutdown (4 bytes, optional).
    pub const NSSD: u32 = 0x64;
    /// Controller Ready Timeouts (4 bytes).
    pub const CRTO: u32 = 0x68;
    /// Persistent Memory Region Capabilities.
    pub const PMRCAP: u32 = 0xe00;
    /// Persistent Memory Region Control.
    pub const PMRCTL: u32 = 0xe04;
    /// Persistent Memory Region Status.
    pub const PMRSTS: u32 = 0xe08;
    /// Persistent Memory Region Elasticity Buffer Size.
    pub const PMREBS: u32 = 0xe0c;
    /// Persistent Memory Region Sustained Write Throughput.
    pub const PMRSWTP: u32 = 0xe10;
    /// Persistent Memory Region Memory Space Control Lower.
    pub const PMRMSCL: u32 = 0xe14;
    /// Persistent Memory Region Memory Space Control Upper.
    pub const PMRMSCU: u32 = 0xe18;
}

/// Value to write to NSSR to reset the NVM subsystem ("NVMe" in ASCII).
pub const NSSR_RESET_VALUE: u32 = 0x4e56_4d65;

/// Controller Capabilities (CAP, offset 0h, 8 bytes; NVMe 2.0 figure 36).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Cap {
    /// Maximum Queue Entries Supported (MQES, bits 15:0), 0-based.
    pub mqes: u16,
    /// Contiguous Queues Required (CQR, bit 16); NVMe-oF requires 1.
    pub cqr: bool,
    /// Arbitration Mechanism Supported (AMS, bits 18:17); see [`cap_ams`]. Two bits.
    pub ams: u8,
    /// Timeout (TO, bits 31:24): worst-case time to become ready, in 500 ms units.
    pub to: u8,
    /// Doorbell Stride (DSTRD, bits 35:32); 0 over fabrics. Four bits.
    pub dstrd: u8,
    /// NVM Subsystem Reset Supported (NSSRS, bit 36).
    pub nssrs: bool,
    /// Command Sets Supported (CSS, bits 44:37); see [`cap_css`].
    pub css: u8,
    /// Boot Partition Support (BPS, bit 45).
    pub bps: bool,
    /// Memory Page Size Minimum (MPSMIN, bits 51:48): 2 ^ (12 + MPSMIN) bytes. Four bits.
    pub mpsmin: u8,
    /// Memory Page Size Maximum (MPSMAX, bits 55:52). Four bits.
    pub mpsmax: u8,
    /// Persistent Memory Region Supported (PMRS, bit 56).
    pub pmrs: bool,
    /// Controller Memory Buffer Supported (CMBS, bit 57).
    pub cmbs: bool,
    /// NVM Subsystem Shutdown Supported (NSSS, bit 58).
    pub nsss: bool,
    /// Controller Ready With Media Support (CRWMS, bit 59).
    pub crwms: bool,
    /// Controller Ready Independent of Media Support (CRIMS, bit 60).
    pub crims: bool,
}

/// CAP.CSS bits.
pub mod cap_css {
    /// NVM command set supported (bit 0).
    pub const NVM: u8 = 1 << 0;
    /// One or more I/O command sets supported, chosen per namespace by CSI (bit 6).
    pub const IOCS: u8 = 1 << 6;
    /// No I/O command set, admin only (bit 7).
    pub const NO_IO: u8 = 1 << 7;
}

/// CAP.AMS bits (round robin is always supported and has no bit).
pub mod cap_ams {
    /// Weighted Round Robin with Urgent Priority Class.
    pub const WRR: u8 = 1 << 0;
    /// Vendor Specific.
    pub const VENDOR_SPECIFIC: u8 = 1 << 1;
}

impl Cap {
    /// The register's value.
    pub const fn to_u64(&self) -> u64 {
        let lo = self.mqes as u32 | flag(self.cqr, 16) | place(self.ams as u32, 17, 2) | (self.to as u32) << 24;
        let hi = place(self.dstrd as u32, 0, 4)
            | flag(self.nssrs, 4)
            | (self.css as u32) << 5
            | flag(self.bps, 13)
            | place(self.mpsmin as u32, 16, 4)
            | place(self.mpsmax as u32, 20, 4)
            | flag(self.pmrs, 24)
            | flag(self.cmbs, 25)
            | flag(self.nsss, 26)
            | flag(self.crwms, 27)
            | flag(self.crims, 28);
        lo as u64 | (hi as u64) << 32
    }

    /// The fields of a register value; reserved bits are dropped.
    pub const fn from_u64(v: u64) -> Cap {
        let lo = v as u32;
        let hi = (v >> 32) as u32;
        Cap {
            mqes: bits(lo, 0, 16) as u16,
            cqr: bit(lo, 16),
            ams: bits(lo, 17, 2) as u8,
            to: bits(lo, 24, 8) as u8,
            dstrd: bits(hi, 0, 4) as u8,
            nssrs: bit(hi, 4),
            css: bits(hi, 5, 8) as u8,
            bps: bit(hi, 13),
            mpsmin: bits(hi, 16, 4) as u8,
            mpsmax: bits(hi, 20, 4) as u8,
            pmrs: bit(hi, 24),
            cmbs: bit(hi, 25),
            nsss: bit(hi, 26),
            crwms: bit(hi, 27),
            crims: bit(hi, 28),
        }
    }
}

/// Version (VS, offset 8h; NVMe 2.0 figure 37).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Vs {
    /// Major Version Number (MJR, bits 31:16).
    pub mjr: u16,
    /// Minor Version Number (MNR, bits 15:8).
    pub mnr: u8,
    /// Tertiary Version Number (TER, bits 7:0).
    pub ter: u8,
}

impl Vs {
    /// NVMe 1.3.
    pub const V1_3: Vs = Vs { mjr: 1, mnr: 3, ter: 0 };
    /// NVMe 1.4.
    pub const V1_4: Vs = Vs { mjr: 1, mnr: 4, ter: 0 };
    /// NVMe 2.0 (what SPDK's target reports; Linux then asks for identify CNS 06h and 08h).
    pub const V2_0: Vs = Vs { mjr: 2, mnr: 0, ter: 0 };

    /// The register's value.
    pub const fn to_u32(&self) -> u32 {
        (self.mjr as u32) << 16 | (self.mnr as u32) << 8 | self.ter as u32
    }

    /// The fields of a register value.
    pub const fn from_u32(v: u32) -> Vs {
        Vs { mjr: bits(v, 16, 16) as u16, mnr: bits(v, 8, 8) as u8, ter: bits(v, 0, 8) as u8 }
    }
}

/// Controller Configuration (CC, offset 14h; NVMe 2.0 figure 41).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Cc {
    /// Enable (EN, bit 0).
    pub en: bool,
    /// I/O Command Set Selected (CSS, bits 6:4); see [`cc_css`]. Three bits.
    pub css: u8,
    /// Memory Page Size (MPS, bits 10:7): 2 ^ (12 + MPS) bytes. Four bits.
    pub mps: u8,
    /// Arbitration Mechanism Selected (AMS, bits 13:11); see [`cc_ams`]. Three bits.
    pub ams: u8,
    /// Shutdown Notification (SHN, bits 15:14); see [`shn`]. Two bits.
    pub shn: u8,
    /// I/O Submission Queue Entry Size (IOSQES, bits 19:16): 2 ^ n bytes, 6 for 64. Four bits.
    pub iosqes: u8,
    /// I/O Completion Queue Entry Size (IOCQES, bits 23:20): 2 ^ n bytes, 4 for 16. Four bits.
    pub iocqes: u8,
    /// Controller Ready Independent of Media Enable (CRIME, bit 24).
    pub crime: bool,
}

/// CC.CSS values.
pub mod cc_css {
    /// NVM command set.
    pub const NVM: u8 = 0x0;
    /// All supported I/O command sets (namespaces name theirs by CSI).
    pub const IOCS: u8 = 0x6;
    /// Admin command set only.
    pub const NO_IO: u8 = 0x7;
}

/// CC.AMS values.
pub mod cc_ams {
    /// Round Robin.
    pub const RR: u8 = 0x0;
    /// Weighted Round Robin with Urgent Priority Class.
    pub const WRR: u8 = 0x1;
    /// Vendor Specific.
    pub const VENDOR_SPECIFIC: u8 = 0x7;
}

/// CC.SHN values.
pub mod shn {
    /// No notification.
    pub const NONE: u8 = 0x0;
    /// Normal shutdown notification.
    pub const NORMAL: u8 = 0x1;
    /// Abrupt shutdown notification.
    pub const ABRUPT: u8 = 0x2;
}

impl Cc {
    /// The register's value.
    pub const fn to_u32(&self) -> u32 {
        flag(self.en, 0)
            | place(self.css as u32, 4, 3)
            | place(self.mps as u32, 7, 4)
            | place(self.ams as u32, 11, 3)
            | place(self.shn as u32, 14, 2)
            | place(self.iosqes as u32, 16, 4)
            | place(self.iocqes as u32, 20, 4)
            | flag(self.crime, 24)
    }

    /// The fields of a register value; reserved bits are dropped.
    pub const fn from_u32(v: u32) -> Cc {
        Cc {
            en: bit(v, 0),
            css: bits(v, 4, 3) as u8,
            mps: bits(v, 7, 4) as u8,
            ams: bits(v, 11, 3) as u8,
            shn: bits(v, 14, 2) as u8,
            iosqes: bits(v, 16, 4) as u8,
            iocqes: bits(v, 20, 4) as u8,
            crime: bit(v, 24),
        }
    }
}

/// Controller Status (CSTS, offset 1Ch; NVMe 2.0 figure 42).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Csts {
    /// Ready (RDY, bit 0).
    pub rdy: bool,
    /// Controller Fatal Status (CFS, bit 1).
    pub cfs: bool,
    /// Shutdown Status (SHST, bits 3:2); see [`shst`]. Two bits.
    pub shst: u8,
    /// NVM Subsystem Reset Occurred (NSSRO, bit 4).
    pub nssro: bool,
    /// Processing Paused (PP, bit 5).
    pub pp: bool,
}

/// CSTS.SHST values.
pub mod shst {
    /// Normal operation.
    pub const NORMAL: u8 = 0x0;
    /// Shutdown processing occurring.
    pub const OCCURRING: u8 = 0x1;
    /// Shutdown processing complete.
    pub const COMPLETE: u8 = 0x2;
}

impl Csts {
    /// The register's value.
    pub const fn to_u32(&self) -> u32 {
        flag(self.rdy, 0) | flag(self.cfs, 1) | place(self.shst as u32, 2, 2) | flag(self.nssro, 4) | flag(self.pp, 5)
    }

    /// The fields of a register value; reserved bits are dropped.
    pub const fn from_u32(v: u32) -> Csts {
        Csts { rdy: bit(v, 0), cfs: bit(v, 1), shst: bits(v, 2, 2) as u8, nssro: bit(v, 4), pp: bit(v, 5) }
    }
}

/// Admin Queue Attributes (AQA, offset 24h; NVMe 2.0 figure 44). PCIe only, but SPDK's fabrics
/// target answers it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Aqa {
    /// Admin Submission Queue Size (ASQS, bits 11:0), 0-based.
    pub asqs: u16,
    /// Admin Completion Queue Size (ACQS, bits 27:16), 0-based.
    pub acqs: u16,
}

impl Aqa {
    /// The register's value.
    pub const fn to_u32(&self) -> u32 {
        place(self.asqs as u32, 0, 12) | place(self.acqs as u32, 16, 12)
    }

    /// The fields of a register value; reserved bits are dropped.
    pub const fn from_u32(v: u32) -> Aqa {
        Aqa { asqs: bits(v, 0, 12) as u16, acqs: bits(v, 16, 12) as u16 }
    }
}

/// Controller Ready Timeouts (CRTO, offset 68h; NVMe 2.0 figure 62).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Crto {
    /// Controller Ready With Media Timeout (CRWMT, bits 15:0), 500 ms units.
    pub crwmt: u16,
    /// Controller Ready Independent of Media Timeout (CRIMT, bits 31:16), 500 ms units.
    pub crimt: u16,
}

impl Crto {
    /// The register's value.
    pub const fn to_u32(&self) -> u32 {
        self.crwmt as u32 | (self.crimt as u32) << 16
    }

    /// The fields of a register value.
    pub const fn from_u32(v: u32) -> Crto {
        Crto { crwmt: bits(v, 0, 16) as u16, crimt: bits(v, 16, 16) as u16 }
    }
}

/// Size in bytes (4 or 8) of the property at `ofst`, for the properties a fabrics controller
/// defines (NVMe 2.0 figure 35), or `None` for a reserved offset.
pub const fn property_size(ofst: u32) -> Option<u8> {
    match ofst {
        offset::CAP => Some(8),
        offset::VS | offset::CC | offset::CSTS | offset::NSSR | offset::NSSD | offset::CRTO => Some(4),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn offsets_match_spdk_static_asserts() {
        // SPDK_STATIC_ASSERT(0x00 == offsetof(struct spdk_nvme_registers, cap)), and so on.
        let expected = [
            (offset::CAP, 0x00),
            (offset::VS, 0x08),
            (offset::INTMS, 0x0c),
            (offset::INTMC, 0x10),
            (offset::CC, 0x14),
            (offset::CSTS, 0x1c),
            (offset::NSSR, 0x20),
            (offset::AQA, 0x24),
            (offset::ASQ, 0x28),
            (offset::ACQ, 0x30),
            (offset::CMBLOC, 0x38),
            (offset::CMBSZ, 0x3c),
            (offset::BPINFO, 0x40),
            (offset::BPRSEL, 0x44),
            (offset::BPMBL, 0x48),
            (offset::CMBMSC, 0x50),
            (offset::CMBSTS, 0x58),
            (offset::CMBEBS, 0x5c),
            (offset::CMBSWTP, 0x60),
            (offset::NSSD, 0x64),
            (offset::CRTO, 0x68),
            (offset::PMRCAP, 0xe00),
            (offset::PMRCTL, 0xe04),
            (offset::PMRSTS, 0xe08),
            (offset::PMREBS, 0xe0c),
            (offset::PMRSWTP, 0xe10),
            (offset::PMRMSCL, 0xe14),
            (offset::PMRMSCU, 0xe18),
        ];
        for (got, want) in expected {
            assert_eq!(got, want);
        }
        assert_eq!(property_size(offset::CAP), Some(8));
        assert_eq!(property_size(offset::CC), Some(4));
        assert_eq!(property_size(offset::INTMS), None);
    }

    #[test]
    fn cap_bits_match_spdk_union() {
        // Bytes of union spdk_nvme_cap_register with one field set to all ones (gcc layout).
        let le = |c: Cap| c.to_u64().to_le_bytes();
        assert_eq!(le(Cap { to: 0xff, ..Cap::default() }), [0, 0, 0, 0xff, 0, 0, 0, 0]);
        assert_eq!(le(Cap { dstrd: 0xf, ..Cap::default() }), [0, 0, 0, 0, 0x0f, 0, 0, 0]);
        assert_eq!(le(Cap { css: 0xff, ..Cap::default() }), [0, 0, 0, 0, 0xe0, 0x1f, 0, 0]);
        assert_eq!(le(Cap { bps: true, ..Cap::default() }), [0, 0, 0, 0, 0, 0x20, 0, 0]);
        assert_eq!(le(Cap { mpsmin: 0xf, ..Cap::default() }), [0, 0, 0, 0, 0, 0, 0x0f, 0]);
        assert_eq!(le(Cap { mpsmax: 0xf, ..Cap::default() }), [0, 0, 0, 0, 0, 0, 0xf0, 0]);
        assert_eq!(le(Cap { crims: true, ..Cap::default() }), [0, 0, 0, 0, 0, 0, 0, 0x10]);
        // Linux: NVME_CAP_MQES = bits 15:0, CSS bits 44:37, CRWMS 1<<59.
        let c = Cap { mqes: 127, cqr: true, css: cap_css::NVM, crwms: true, ..Cap::default() };
        assert_eq!(c.to_u64(), 127 | 1 << 16 | 1 << 37 | 1 << 59);
        assert_eq!(Cap::from_u64(c.to_u64()), c);
    }

    #[test]
    fn vs_cc_csts_bits() {
        assert_eq!(Vs::V2_0.to_u32(), 0x0002_0000);
        assert_eq!(Vs::from_u32(0x0001_0201), Vs { mjr: 1, mnr: 2, ter: 1 });
        assert!(Vs::V1_3 < Vs::V2_0);
        // SPDK union spdk_nvme_cc_register with shn = 3, iosqes = 0xf, iocqes = 0xf, crime = 1.
        assert_eq!(Cc { shn: 3, ..Cc::default() }.to_u32().to_le_bytes(), [0, 0xc0, 0, 0]);
        assert_eq!(Cc { iosqes: 0xf, ..Cc::default() }.to_u32().to_le_bytes(), [0, 0, 0x0f, 0]);
        assert_eq!(Cc { iocqes: 0xf, ..Cc::default() }.to_u32().to_le_bytes(), [0, 0, 0xf0, 0]);
        assert_eq!(Cc { crime: true, ..Cc::default() }.to_u32().to_le_bytes(), [0, 0, 0, 1]);
        // What Linux writes to enable: CSS NVM, MPS 0 (4 KiB), AMS RR, IOSQES 6, IOCQES 4, EN.
        let cc = Cc { en: true, iosqes: 6, iocqes: 4, ..Cc::default() };
        assert_eq!(cc.to_u32(), 0x0046_0001);
        assert_eq!(Cc::from_u32(0x0046_0001), cc);
        assert_eq!(Cc { shn: shn::NORMAL, ..cc }.to_u32(), 0x0046_4001);
        assert_eq!(Csts { rdy: true, shst: shst::COMPLETE, ..Csts::default() }.to_u32(), 0x9);
        assert_eq!(Csts::from_u32(0x32), Csts { cfs: true, nssro: true, pp: true, ..Csts::default() });
        assert_eq!(Aqa { asqs: 31, acqs: 31 }.to_u32(), 0x001f_001f);
        assert_eq!(Crto::from_u32(0x0002_0001), Crto { crwmt: 1, crimt: 2 });
    }

    proptest! {
        #[test]
        fn registers_round_trip(v in any::<u64>()) {
            let cap = Cap::from_u64(v);
            prop_assert_eq!(Cap::from_u64(cap.to_u64()), cap);
            let w = v as u32;
            prop_assert_eq!(Vs::from_u32(w).to_u32(), w);
            prop_assert_eq!(Crto::from_u32(w).to_u32(), w);
            let cc = Cc::from_u32(w);
            prop_assert_eq!(Cc::from_u32(cc.to_u32()), cc);
            prop_assert_eq!(cc.to_u32(), w & 0x01ff_fff1);
            let csts = Csts::from_u32(w);
            prop_assert_eq!(csts.to_u32(), w & 0x3f);
            let aqa = Aqa::from_u32(w);
            prop_assert_eq!(aqa.to_u32(), w & 0x0fff_0fff);
            prop_assert_eq!(cap.to_u64(), v & 0x1fff_3fff_ff07_ffff);
        }
    }
}
