//! Command dword fields of the admin commands a fabrics controller serves (NVMe Base
//! Specification 2.0: section 5.1 Abort, 5.2 Asynchronous Event Request, 5.16 Get Log Page,
//! 5.17 Identify, 5.25 Keep Alive, 5.27 Get/Set Features; SPDK `union spdk_nvme_cmd_cdw10` and
//! `cdw11`, libnvme's `NVME_*_CDW*_SHIFT/MASK`).
//!
//! Like [`super::io`], each command is a view over an [`Sqe`]'s CDW10-15 with `from_sqe` and
//! `apply`. Keep Alive and Asynchronous Event Request have no fields of their own.

use super::le::{bit, bits, flag, place};
use super::opcode::admin;
use super::sqe::Sqe;

/// Identify (NVMe 2.0 figures 273-274): CDW10 CNS and CNTID, CDW11 CNS Specific Identifier and
/// CSI, CDW14 UUID Index. The namespace is the SQE's NSID.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct IdentifyCommand {
    /// Controller or Namespace Structure (CNS, CDW10 bits 7:0); see
    /// [`super::identify::cns`].
    pub cns: u8,
    /// Controller Identifier (CNTID, CDW10 bits 31:16).
    pub cntid: u16,
    /// CNS Specific Identifier (CDW11 bits 15:0; NVM Set Identifier in NVMe 1.4, SPDK
    /// `nvmsetid`).
    pub cnssid: u16,
    /// Command Set Identifier (CSI, CDW11 bits 31:24); see [`super::identify::csi`].
    pub csi: u8,
    /// UUID Index (CDW14 bits 6:0).
    pub uuid_index: u8,
}

impl IdentifyCommand {
    /// Reads the fields from `sqe`.
    pub const fn from_sqe(sqe: &Sqe) -> IdentifyCommand {
        IdentifyCommand {
            cns: bits(sqe.cdw10, 0, 8) as u8,
            cntid: bits(sqe.cdw10, 16, 16) as u16,
            cnssid: bits(sqe.cdw11, 0, 16) as u16,
            csi: bits(sqe.cdw11, 24, 8) as u8,
            uuid_index: bits(sqe.cdw14, 0, 7) as u8,
        }
    }

    /// Writes the fields into `sqe`'s CDW10, CDW11 and CDW14.
    pub fn apply(&self, sqe: &mut Sqe) {
        sqe.cdw10 = self.cns as u32 | (self.cntid as u32) << 16;
        sqe.cdw11 = self.cnssid as u32 | (self.csi as u32) << 24;
        sqe.cdw14 = place(self.uuid_index as u32, 0, 7);
    }
}

/// Get Log Page (NVMe 2.0 figures 196-199): CDW10 LID, LSP, RAE and NUMDL, CDW11 NUMDU and
/// LSI, CDW12-13 the offset, CDW14 UUID Index, Offset Type and CSI.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct GetLogPageCommand {
    /// Log Page Identifier (LID, CDW10 bits 7:0); see [`super::log::lid`].
    pub lid: u8,
    /// Log Specific Parameter (LSP, CDW10 bits 14:8). Seven bits since NVMe 2.0; NVMe 1.4 had
    /// four (Linux's `nvme.h` still says "upper 4 bits reserved").
    pub lsp: u8,
    /// Retain Asynchronous Event (RAE, CDW10 bit 15): reading the page does not clear the
    /// event that announced it.
    pub rae: bool,
    /// Number of Dwords (NUMDU in CDW11 bits 15:0, NUMDL in CDW10 bits 31:16), 0-based.
    pub numd: u32,
    /// Log Specific Identifier (LSI, CDW11 bits 31:16).
    pub lsi: u16,
    /// Log Page Offset (LPOU:LPOL, CDW13:CDW12): a byte offset (dword aligned) unless
    /// [`GetLogPageCommand::ot`] makes it an index.
    pub lpo: u64,
    /// UUID Index (CDW14 bits 6:0).
    pub uuid_index: u8,
    /// Offset Type (OT, CDW14 bit 23): the offset is an entry index, not a byte offset.
    pub ot: bool,
    /// Command Set Identifier (CSI, CDW14 bits 31:24).
    pub csi: u8,
}

impl GetLogPageCommand {
    /// Bytes the host asked for: (NUMD + 1) dwords.
    pub const fn transfer_len(&self) -> u64 {
        (self.numd as u64 + 1) * 4
    }

    /// Sets NUMD for a transfer of `bytes` (rounded down to dwords; at least one dword).
    pub fn set_transfer_len(&mut self, bytes: u64) {
        self.numd = (bytes / 4).saturating_sub(1).min(u32::MAX as u64) as u32;
    }

    /// Reads the fields from `sqe`.
    pub const fn from_sqe(sqe: &Sqe) -> GetLogPageCommand {
        GetLogPageCommand {
            lid: bits(sqe.cdw10, 0, 8) as u8,
            lsp: bits(sqe.cdw10, 8, 7) as u8,
            rae: bit(sqe.cdw10, 15),
            numd: bits(sqe.cdw10, 16, 16) | bits(sqe.cdw11, 0, 16) << 16,
            lsi: bits(sqe.cdw11, 16, 16) as u16,
            lpo: sqe.cdw12 as u64 | (sqe.cdw13 as u64) << 32,
            uuid_index: bits(sqe.cdw14, 0, 7) as u8,
            ot: bit(sqe.cdw14, 23),
            csi: bits(sqe.cdw14, 24, 8) as u8,
        }
    }

    /// Writes the fields into `sqe`'s CDW10-14.
    pub fn apply(&self, sqe: &mut Sqe) {
        sqe.cdw10 = self.lid as u32 | place(self.lsp as u32, 8, 7) | flag(self.rae, 15) | (self.numd & 0xffff) << 16;
        sqe.cdw11 = self.numd >> 16 | (self.lsi as u32) << 16;
        sqe.cdw12 = self.lpo as u32;
        sqe.cdw13 = (self.lpo >> 32) as u32;
        sqe.cdw14 = place(self.uuid_index as u32, 0, 7) | flag(self.ot, 23) | (self.csi as u32) << 24;
    }
}

/// Get Features (NVMe 2.0 figures 185-186): CDW10 FID and SEL, CDW11 feature specific (for
/// example the interrupt vector), CDW14 UUID Index.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct GetFeaturesCommand {
    /// Feature Identifier (FID, CDW10 bits 7:0); see [`super::features::fid`].
    pub fid: u8,
    /// Select (SEL, CDW10 bits 10:8); see [`select`]. Three bits.
    pub sel: u8,
    /// Feature specific CDW11.
    pub cdw11: u32,
    /// UUID Index (CDW14 bits 6:0).
    pub uuid_index: u8,
}

impl GetFeaturesCommand {
    /// Reads the fields from `sqe`.
    pub const fn from_sqe(sqe: &Sqe) -> GetFeaturesCommand {
        GetFeaturesCommand {
            fid: bits(sqe.cdw10, 0, 8) as u8,
            sel: bits(sqe.cdw10, 8, 3) as u8,
            cdw11: sqe.cdw11,
            uuid_index: bits(sqe.cdw14, 0, 7) as u8,
        }
    }

    /// Writes the fields into `sqe`'s CDW10, CDW11 and CDW14.
    pub fn apply(&self, sqe: &mut Sqe) {
        sqe.cdw10 = self.fid as u32 | place(self.sel as u32, 8, 3);
        sqe.cdw11 = self.cdw11;
        sqe.cdw14 = place(self.uuid_index as u32, 0, 7);
    }
}

/// Select values of Get Features (SEL; NVMe 2.0 figure 186).
pub mod select {
    /// Current value.
    pub const CURRENT: u8 = 0;
    /// Default value.
    pub const DEFAULT: u8 = 1;
    /// Saved value.
    pub const SAVED: u8 = 2;
    /// Supported capabilities: dword 0 answers with [`capabilities`] bits.
    pub const SUPPORTED_CAPABILITIES: u8 = 3;

    /// Dword 0 bits of the answer to [`SUPPORTED_CAPABILITIES`] (NVMe 2.0 figure 188).
    pub mod capabilities {
        /// The feature is saveable.
        pub const SAVEABLE: u32 = 1 << 0;
        /// The feature is namespace specific.
        pub const NAMESPACE_SPECIFIC: u32 = 1 << 1;
        /// The feature is changeable.
        pub const CHANGEABLE: u32 = 1 << 2;
    }
}

/// Set Features (NVMe 2.0 figures 317-318): CDW10 FID and SV, CDW11-13 feature specific,
/// CDW14 UUID Index. Some features also carry data (Host Identifier, Timestamp).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SetFeaturesCommand {
    /// Feature Identifier (FID, CDW10 bits 7:0); see [`super::features::fid`].
    pub fid: u8,
    /// Save (SV, CDW10 bit 31): keep the value across power cycles and resets.
    pub sv: bool,
    /// Feature specific CDW11 (the value of most features; see [`super::features`]).
    pub cdw11: u32,
    /// Feature specific CDW12.
    pub cdw12: u32,
    /// Feature specific CDW13.
    pub cdw13: u32,
    /// UUID Index (CDW14 bits 6:0).
    pub uuid_index: u8,
}

impl SetFeaturesCommand {
    /// Reads the fields from `sqe`.
    pub const fn from_sqe(sqe: &Sqe) -> SetFeaturesCommand {
        SetFeaturesCommand {
            fid: bits(sqe.cdw10, 0, 8) as u8,
            sv: bit(sqe.cdw10, 31),
            cdw11: sqe.cdw11,
            cdw12: sqe.cdw12,
            cdw13: sqe.cdw13,
            uuid_index: bits(sqe.cdw14, 0, 7) as u8,
        }
    }

    /// Writes the fields into `sqe`'s CDW10-14.
    pub fn apply(&self, sqe: &mut Sqe) {
        sqe.cdw10 = self.fid as u32 | flag(self.sv, 31);
        sqe.cdw11 = self.cdw11;
        sqe.cdw12 = self.cdw12;
        sqe.cdw13 = self.cdw13;
        sqe.cdw14 = place(self.uuid_index as u32, 0, 7);
    }
}

/// Abort (NVMe 2.0 figure 143): CDW10 SQID and CID of the command to abort.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AbortCommand {
    /// Submission Queue Identifier (SQID, CDW10 bits 15:0).
    pub sqid: u16,
    /// Command Identifier (CID, CDW10 bits 31:16).
    pub cid: u16,
}

impl AbortCommand {
    /// Completion dword 0 bit 0 (NVMe 2.0 figure 144, "Immediate Abort Not Performed"): set
    /// when the command was not aborted. SPDK's `spdk_nvme_cpl_is_abort_success` tests it.
    pub const NOT_ABORTED: u32 = 1 << 0;

    /// Reads the fields from `sqe`.
    pub const fn from_sqe(sqe: &Sqe) -> AbortCommand {
        AbortCommand { sqid: bits(sqe.cdw10, 0, 16) as u16, cid: bits(sqe.cdw10, 16, 16) as u16 }
    }

    /// Writes the fields into `sqe`'s CDW10.
    pub fn apply(&self, sqe: &mut Sqe) {
        sqe.cdw10 = self.sqid as u32 | (self.cid as u32) << 16;
    }
}

/// A Keep Alive command (NVMe 2.0 section 5.25): opcode 18h, no fields. Any command resets the
/// controller's timer only if it supports traffic based keep alive (CTRATT.TBKAS).
pub fn keep_alive(cid: u16) -> Sqe {
    Sqe::new(admin::KEEP_ALIVE, cid, 0)
}

/// An Asynchronous Event Request (NVMe 2.0 section 5.2): opcode 0Ch, no fields; it completes
/// when an event happens, with the event in dword 0 (see [`super::aer`]).
pub fn async_event_request(cid: u16) -> Sqe {
    Sqe::new(admin::ASYNC_EVENT_REQUEST, cid, 0)
}

#[cfg(test)]
mod tests {
    use super::super::sqe::tests::sqe;
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn identify_bits_match_spdk_and_linux() {
        // SPDK cdw10 identify: cns:8, reserved:8, cntid:16; cdw11: nvmsetid:16, reserved:8,
        // csi:8. Linux struct nvme_identify: cns at byte 40, ctrlid 42, cnssid 44, csi 47.
        let id = IdentifyCommand { cns: 0x06, cntid: 0xabcd, cnssid: 0x1234, csi: 2, uuid_index: 0x7f };
        let mut s = Sqe::new(admin::IDENTIFY, 1, 0);
        id.apply(&mut s);
        let b = s.to_bytes();
        assert_eq!(&b[40..48], &[0x06, 0, 0xcd, 0xab, 0x34, 0x12, 0, 2]);
        assert_eq!(&b[56..60], &[0x7f, 0, 0, 0]);
        assert_eq!(IdentifyCommand::from_sqe(&Sqe::decode(&b)), id);
    }

    #[test]
    fn get_log_page_bits_match_spdk_and_linux() {
        // SPDK cdw10 get_log_page: lid:8, lsp:7, rae:1, numdl:16; cdw11: numdu:16, lsid:16.
        // Linux: lid byte 40, lsp 41, numdl 42, numdu 44, lsi 46, lpol 48, lpou 52, csi 59.
        let mut g = GetLogPageCommand {
            lid: 0x0c,
            lsp: 0x7f,
            rae: true,
            numd: 0,
            lsi: 0x5566,
            lpo: 0x0000_0001_0000_0010,
            uuid_index: 1,
            ot: true,
            csi: 2,
        };
        g.set_transfer_len(0x4_0004);
        assert_eq!(g.numd, 0x1_0000);
        assert_eq!(g.transfer_len(), 0x4_0004);
        let mut s = Sqe::new(admin::GET_LOG_PAGE, 1, 0xffff_ffff);
        g.apply(&mut s);
        let b = s.to_bytes();
        assert_eq!(&b[40..48], &[0x0c, 0xff, 0x00, 0x00, 0x01, 0x00, 0x66, 0x55]);
        assert_eq!(&b[48..56], &[0x10, 0, 0, 0, 1, 0, 0, 0]);
        assert_eq!(&b[56..60], &[1, 0, 0x80, 2]);
        assert_eq!(GetLogPageCommand::from_sqe(&Sqe::decode(&b)), g);
        g.set_transfer_len(0);
        assert_eq!((g.numd, g.transfer_len()), (0, 4));
        g.set_transfer_len(512);
        assert_eq!(g.numd, 127);
    }

    #[test]
    fn features_bits() {
        // SPDK get_features: fid:8, sel:3; set_features: fid:8, reserved:23, sv:1.
        let g = GetFeaturesCommand { fid: 0x07, sel: select::SUPPORTED_CAPABILITIES, cdw11: 9, uuid_index: 0 };
        let mut s = Sqe::new(admin::GET_FEATURES, 1, 0);
        g.apply(&mut s);
        assert_eq!((s.cdw10, s.cdw11), (0x0307, 9));
        assert_eq!(GetFeaturesCommand::from_sqe(&s), g);
        let f = SetFeaturesCommand { fid: 0x0b, sv: true, cdw11: 0x8000_0900, ..Default::default() };
        f.apply(&mut s);
        assert_eq!((s.cdw10, s.cdw11), (0x8000_000b, 0x8000_0900));
        assert_eq!(SetFeaturesCommand::from_sqe(&s), f);
    }

    #[test]
    fn abort_keep_alive_aer() {
        // SPDK abort: sqid:16, cid:16.
        let a = AbortCommand { sqid: 1, cid: 0x2233 };
        let mut s = Sqe::new(admin::ABORT, 1, 0);
        a.apply(&mut s);
        assert_eq!(s.cdw10, 0x2233_0001);
        assert_eq!(AbortCommand::from_sqe(&s), a);
        assert_eq!(keep_alive(5).to_bytes()[0], 0x18);
        assert_eq!(async_event_request(6).to_bytes()[..4], [0x0c, 0x40, 6, 0]);
    }

    proptest! {
        #[test]
        fn views_round_trip(s in sqe()) {
            let mut t = s;
            let v = IdentifyCommand::from_sqe(&s);
            v.apply(&mut t);
            prop_assert_eq!(IdentifyCommand::from_sqe(&t), v);
            let v = GetLogPageCommand::from_sqe(&s);
            v.apply(&mut t);
            prop_assert_eq!(GetLogPageCommand::from_sqe(&t), v);
            let v = GetFeaturesCommand::from_sqe(&s);
            v.apply(&mut t);
            prop_assert_eq!(GetFeaturesCommand::from_sqe(&t), v);
            let v = SetFeaturesCommand::from_sqe(&s);
            v.apply(&mut t);
            prop_assert_eq!(SetFeaturesCommand::from_sqe(&t), v);
            let v = AbortCommand::from_sqe(&s);
            v.apply(&mut t);
            prop_assert_eq!(AbortCommand::from_sqe(&t), v);
        }
    }
}
