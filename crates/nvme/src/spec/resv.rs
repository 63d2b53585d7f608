//! Reservation commands (NVMe Base Specification 2.0, sections 7.2 Reservation Acquire, 7.3
//! Reservation Register, 7.4 Reservation Release, 7.5 Reservation Report; 8.19 the model):
//! their command dwords, the keys they carry as data, and the extended Reservation Status data
//! structure Report returns (figures 388-392; SPDK's `spdk_nvme_reservation_*` in
//! `nvme_spec.h`). A host builds a command with [`command`] and sends the data beside it.

use super::opcode::nvm;
use super::sqe::Sqe;

/// Reservation types (RTYPE, figure 384 / 8.19.1).
pub mod rtype {
    /// Write Exclusive.
    pub const WRITE_EXCLUSIVE: u8 = 1;
    /// Exclusive Access.
    pub const EXCLUSIVE_ACCESS: u8 = 2;
    /// Write Exclusive - Registrants Only.
    pub const WRITE_EXCLUSIVE_REG_ONLY: u8 = 3;
    /// Exclusive Access - Registrants Only.
    pub const EXCLUSIVE_ACCESS_REG_ONLY: u8 = 4;
    /// Write Exclusive - All Registrants (Mayastor's nexus default).
    pub const WRITE_EXCLUSIVE_ALL_REGS: u8 = 5;
    /// Exclusive Access - All Registrants.
    pub const EXCLUSIVE_ACCESS_ALL_REGS: u8 = 6;
}

/// Reservation Register actions (RREGA, CDW10 bits 2:0).
pub mod rrega {
    /// Register a reservation key.
    pub const REGISTER: u8 = 0;
    /// Unregister.
    pub const UNREGISTER: u8 = 1;
    /// Replace the key (with IEKEY: register whatever the current key is, or none).
    pub const REPLACE: u8 = 2;
}

/// Reservation Acquire actions (RACQA, CDW10 bits 2:0).
pub mod racqa {
    /// Acquire.
    pub const ACQUIRE: u8 = 0;
    /// Preempt the registrants with PRKEY.
    pub const PREEMPT: u8 = 1;
    /// Preempt and abort their commands.
    pub const PREEMPT_AND_ABORT: u8 = 2;
}

/// Reservation Release actions (RRELA, CDW10 bits 2:0).
pub mod rrela {
    /// Release.
    pub const RELEASE: u8 = 0;
    /// Clear: every registration and the reservation go.
    pub const CLEAR: u8 = 1;
}

/// Change Persist Through Power Loss State (CPTPL, Register's CDW10 bits 31:30).
pub mod cptpl {
    /// No change.
    pub const NO_CHANGE: u8 = 0;
    /// Cleared at power on.
    pub const CLEAR: u8 = 2;
    /// Persists through a power loss.
    pub const PERSIST: u8 = 3;
}

/// A reservation command: its entry (NSID, CDW10, CDW11; CID and data pointer are the
/// transport's) and its data (the keys; for Report, the length of the buffer to read into).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResvCommand {
    /// The submission queue entry.
    pub sqe: Sqe,
    /// Data sent with it (Register, Acquire, Release), empty for Report.
    pub data: Vec<u8>,
    /// Bytes the controller returns (Report), 0 for the others.
    pub read_len: usize,
}

fn keys(a: u64, b: Option<u64>) -> Vec<u8> {
    let mut v = a.to_le_bytes().to_vec();
    if let Some(b) = b {
        v.extend_from_slice(&b.to_le_bytes());
    }
    v
}

/// Reservation Register (figures 394-395): action `rrega`, Ignore Existing Key, CPTPL; data
/// CRKEY then NRKEY.
pub fn register(nsid: u32, rrega: u8, iekey: bool, cptpl: u8, crkey: u64, nrkey: u64) -> ResvCommand {
    let mut sqe = Sqe::new(nvm::RESERVATION_REGISTER, 0, nsid);
    sqe.cdw10 = u32::from(rrega & 7) | u32::from(iekey) << 3 | u32::from(cptpl & 3) << 30;
    ResvCommand { sqe, data: keys(crkey, Some(nrkey)), read_len: 0 }
}

/// Reservation Acquire (figures 385-386): action `racqa` for type `rtype`; data CRKEY then
/// PRKEY.
pub fn acquire(nsid: u32, racqa: u8, iekey: bool, rtype: u8, crkey: u64, prkey: u64) -> ResvCommand {
    let mut sqe = Sqe::new(nvm::RESERVATION_ACQUIRE, 0, nsid);
    sqe.cdw10 = u32::from(racqa & 7) | u32::from(iekey) << 3 | u32::from(rtype) << 8;
    ResvCommand { sqe, data: keys(crkey, Some(prkey)), read_len: 0 }
}

/// Reservation Release (figures 397-398): action `rrela` of type `rtype`; data CRKEY.
pub fn release(nsid: u32, rrela: u8, iekey: bool, rtype: u8, crkey: u64) -> ResvCommand {
    let mut sqe = Sqe::new(nvm::RESERVATION_RELEASE, 0, nsid);
    sqe.cdw10 = u32::from(rrela & 7) | u32::from(iekey) << 3 | u32::from(rtype) << 8;
    ResvCommand { sqe, data: keys(crkey, None), read_len: 0 }
}

/// Reservation Report (figures 400-401) with the extended data structure (EDS, 128-bit host
/// identifiers) into `len` bytes (a multiple of 4).
pub fn report(nsid: u32, len: usize) -> ResvCommand {
    let mut sqe = Sqe::new(nvm::RESERVATION_REPORT, 0, nsid);
    sqe.cdw10 = (len / 4).saturating_sub(1) as u32;
    sqe.cdw11 = 1;
    ResvCommand { sqe, data: Vec::new(), read_len: len }
}

/// One registrant in an extended report (figure 392).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registrant {
    /// Controller ID (FFFFh: none of its host connected).
    pub cntlid: u16,
    /// Holds the reservation (RCSTS bit 0).
    pub holder: bool,
    /// Its reservation key.
    pub rkey: u64,
    /// Its 128-bit Host Identifier.
    pub hostid: [u8; 16],
}

/// The extended Reservation Status data structure (figures 390-392).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ReportData {
    /// Generation.
    pub generation: u32,
    /// Reservation type held (0: none).
    pub rtype: u8,
    /// Persist Through Power Loss State.
    pub ptpls: bool,
    /// The registrants (as many as the buffer held).
    pub registrants: Vec<Registrant>,
}

/// Bytes of the extended header and of each registrant's entry.
pub const REPORT_ENTRY: usize = 64;

impl ReportData {
    /// Decodes an extended report; entries past the end of `b` are left out. None if `b` is
    /// shorter than the header.
    pub fn decode(b: &[u8]) -> Option<ReportData> {
        if b.len() < REPORT_ENTRY {
            return None;
        }
        let regctl = u16::from_le_bytes([b[5], b[6]]) as usize;
        let registrants = b[REPORT_ENTRY..]
            .chunks_exact(REPORT_ENTRY)
            .take(regctl)
            .map(|e| Registrant {
                cntlid: u16::from_le_bytes([e[0], e[1]]),
                holder: e[2] & 1 != 0,
                rkey: u64::from_le_bytes(e[8..16].try_into().expect("8 bytes")),
                hostid: e[16..32].try_into().expect("16 bytes"),
            })
            .collect();
        Some(ReportData {
            generation: u32::from_le_bytes(b[0..4].try_into().expect("4 bytes")),
            rtype: b[4],
            ptpls: b[9] & 1 != 0,
            registrants,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_dwords_and_keys() {
        let c = register(1, rrega::REPLACE, true, cptpl::NO_CHANGE, 0, 0xabcd);
        assert_eq!((c.sqe.opcode, c.sqe.nsid, c.sqe.cdw10), (0x0d, 1, 0b1010));
        assert_eq!(c.data, [0u64.to_le_bytes(), 0xabcdu64.to_le_bytes()].concat());
        let c = acquire(2, racqa::PREEMPT, false, rtype::WRITE_EXCLUSIVE_ALL_REGS, 7, 9);
        assert_eq!((c.sqe.opcode, c.sqe.cdw10), (0x11, 0x501));
        assert_eq!(&c.data[8..], &9u64.to_le_bytes());
        let c = release(2, rrela::CLEAR, false, 0, 7);
        assert_eq!((c.sqe.opcode, c.sqe.cdw10, c.data.len()), (0x15, 1, 8));
        let c = report(3, 4096);
        assert_eq!((c.sqe.opcode, c.sqe.cdw10, c.sqe.cdw11, c.read_len), (0x0e, 1023, 1, 4096));
    }

    #[test]
    fn an_extended_report_decodes() {
        let mut b = vec![0u8; 3 * REPORT_ENTRY];
        b[0] = 4;
        b[4] = 5;
        b[5] = 2;
        b[9] = 1;
        b[64] = 1;
        b[66] = 1;
        b[72..80].copy_from_slice(&0x11u64.to_le_bytes());
        b[80..96].copy_from_slice(&[7; 16]);
        b[128..130].copy_from_slice(&0xffffu16.to_le_bytes());
        b[136..144].copy_from_slice(&0x22u64.to_le_bytes());
        let r = ReportData::decode(&b).unwrap();
        assert_eq!((r.generation, r.rtype, r.ptpls, r.registrants.len()), (4, 5, true, 2));
        assert_eq!(r.registrants[0], Registrant { cntlid: 1, holder: true, rkey: 0x11, hostid: [7; 16] });
        assert_eq!((r.registrants[1].cntlid, r.registrants[1].holder, r.registrants[1].rkey), (0xffff, false, 0x22));
        assert!(ReportData::decode(&b[..10]).is_none());
        assert_eq!(ReportData::decode(&b[..128]).unwrap().registrants.len(), 1, "cut short");
    }
}
