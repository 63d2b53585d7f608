//! The CDB decoder: a pure function from CDB bytes to a [`Command`] or the [`Fault`] that
//! rejects them (fuzzed by `fuzz/fuzz_targets/scsi_cdb.rs`, property-tested in
//! `tests/cdb_props.rs`).
//!
//! Every supported command has one row in [`OPS`]: its opcode (and service action), length and
//! CDB usage data, the mask of the bits the device server looks at (SPC-4 6.35.3). The same
//! row answers REPORT SUPPORTED OPERATION CODES, and the decoder refuses any bit outside it
//! (a reserved bit, protection information we do not have, NACA) with INVALID FIELD IN CDB
//! pointing at the byte and bit, so what the target reports and what it accepts cannot
//! differ. What the CDB alone cannot tell (an LBA beyond the capacity, a length beyond a
//! limit) is checked where the command runs.

use crate::sense::Fault;

/// Operation codes.
pub mod op {
    #![allow(missing_docs)]
    pub const TEST_UNIT_READY: u8 = 0x00;
    pub const REQUEST_SENSE: u8 = 0x03;
    pub const READ_6: u8 = 0x08;
    pub const WRITE_6: u8 = 0x0a;
    pub const INQUIRY: u8 = 0x12;
    pub const MODE_SELECT_6: u8 = 0x15;
    pub const RESERVE_6: u8 = 0x16;
    pub const RELEASE_6: u8 = 0x17;
    pub const MODE_SENSE_6: u8 = 0x1a;
    pub const START_STOP_UNIT: u8 = 0x1b;
    pub const READ_CAPACITY_10: u8 = 0x25;
    pub const READ_10: u8 = 0x28;
    pub const WRITE_10: u8 = 0x2a;
    pub const WRITE_AND_VERIFY_10: u8 = 0x2e;
    pub const VERIFY_10: u8 = 0x2f;
    pub const PRE_FETCH_10: u8 = 0x34;
    pub const SYNCHRONIZE_CACHE_10: u8 = 0x35;
    pub const WRITE_SAME_10: u8 = 0x41;
    pub const UNMAP: u8 = 0x42;
    pub const MODE_SELECT_10: u8 = 0x55;
    pub const RESERVE_10: u8 = 0x56;
    pub const RELEASE_10: u8 = 0x57;
    pub const MODE_SENSE_10: u8 = 0x5a;
    pub const PERSISTENT_RESERVE_IN: u8 = 0x5e;
    pub const PERSISTENT_RESERVE_OUT: u8 = 0x5f;
    pub const READ_16: u8 = 0x88;
    pub const COMPARE_AND_WRITE: u8 = 0x89;
    pub const WRITE_16: u8 = 0x8a;
    pub const WRITE_AND_VERIFY_16: u8 = 0x8e;
    pub const VERIFY_16: u8 = 0x8f;
    pub const PRE_FETCH_16: u8 = 0x90;
    pub const SYNCHRONIZE_CACHE_16: u8 = 0x91;
    pub const WRITE_SAME_16: u8 = 0x93;
    pub const SERVICE_ACTION_IN_16: u8 = 0x9e;
    pub const REPORT_LUNS: u8 = 0xa0;
    pub const MAINTENANCE_IN: u8 = 0xa3;
    pub const READ_12: u8 = 0xa8;
    pub const WRITE_12: u8 = 0xaa;
    pub const WRITE_AND_VERIFY_12: u8 = 0xae;
    pub const VERIFY_12: u8 = 0xaf;

    /// SERVICE ACTION IN(16): READ CAPACITY(16).
    pub const SA_READ_CAPACITY_16: u16 = 0x10;
    /// SERVICE ACTION IN(16): GET LBA STATUS.
    pub const SA_GET_LBA_STATUS: u16 = 0x12;
    /// MAINTENANCE IN: REPORT TARGET PORT GROUPS.
    pub const SA_REPORT_TARGET_PORT_GROUPS: u16 = 0x0a;
    /// MAINTENANCE IN: REPORT SUPPORTED OPERATION CODES.
    pub const SA_REPORT_SUPPORTED_OPCODES: u16 = 0x0c;
    /// MAINTENANCE IN: REPORT SUPPORTED TASK MANAGEMENT FUNCTIONS.
    pub const SA_REPORT_SUPPORTED_TMFS: u16 = 0x0d;
}

/// One supported command: opcode, service action (for commands that have them) and CDB usage
/// data (its first byte the opcode, then the mask of each byte; the control byte last).
#[derive(Debug, Clone, Copy)]
pub struct OpInfo {
    /// Operation code.
    pub opcode: u8,
    /// Service action, for opcodes whose byte 1 holds one.
    pub sa: Option<u16>,
    /// CDB usage data: `usage.len()` is the CDB length.
    pub usage: &'static [u8],
}

const fn op(opcode: u8, usage: &'static [u8]) -> OpInfo {
    OpInfo { opcode, sa: None, usage }
}

const fn sa(opcode: u8, sa: u16, usage: &'static [u8]) -> OpInfo {
    OpInfo { opcode, sa: Some(sa), usage }
}

/// The control byte's usage: NACA and LINK are not supported (SAM-5), so no bit is.
const C: u8 = 0x00;

/// Every supported command, by opcode then service action (the order REPORT SUPPORTED
/// OPERATION CODES lists them in).
#[rustfmt::skip]
pub static OPS: &[OpInfo] = &[
    op(op::TEST_UNIT_READY, &[0x00, 0, 0, 0, 0, C]),
    op(op::REQUEST_SENSE, &[0x03, 0x01, 0, 0, 0xff, C]),
    op(op::READ_6, &[0x08, 0x1f, 0xff, 0xff, 0xff, C]),
    op(op::WRITE_6, &[0x0a, 0x1f, 0xff, 0xff, 0xff, C]),
    op(op::INQUIRY, &[0x12, 0x01, 0xff, 0xff, 0xff, C]),
    op(op::MODE_SELECT_6, &[0x15, 0x11, 0, 0, 0xff, C]),
    op(op::RESERVE_6, &[0x16, 0, 0, 0, 0, C]),
    op(op::RELEASE_6, &[0x17, 0, 0, 0, 0, C]),
    op(op::MODE_SENSE_6, &[0x1a, 0x08, 0xff, 0xff, 0xff, C]),
    op(op::START_STOP_UNIT, &[0x1b, 0x01, 0, 0x0f, 0xf7, C]),
    op(op::READ_CAPACITY_10, &[0x25, 0, 0xff, 0xff, 0xff, 0xff, 0, 0, 0x01, C]),
    op(op::READ_10, &[0x28, 0x1a, 0xff, 0xff, 0xff, 0xff, 0x1f, 0xff, 0xff, C]),
    op(op::WRITE_10, &[0x2a, 0x1a, 0xff, 0xff, 0xff, 0xff, 0x1f, 0xff, 0xff, C]),
    op(op::WRITE_AND_VERIFY_10, &[0x2e, 0x12, 0xff, 0xff, 0xff, 0xff, 0x1f, 0xff, 0xff, C]),
    op(op::VERIFY_10, &[0x2f, 0x16, 0xff, 0xff, 0xff, 0xff, 0x1f, 0xff, 0xff, C]),
    op(op::PRE_FETCH_10, &[0x34, 0x02, 0xff, 0xff, 0xff, 0xff, 0x1f, 0xff, 0xff, C]),
    op(op::SYNCHRONIZE_CACHE_10, &[0x35, 0x06, 0xff, 0xff, 0xff, 0xff, 0x1f, 0xff, 0xff, C]),
    op(op::WRITE_SAME_10, &[0x41, 0x18, 0xff, 0xff, 0xff, 0xff, 0x1f, 0xff, 0xff, C]),
    op(op::UNMAP, &[0x42, 0x01, 0, 0, 0, 0, 0x1f, 0xff, 0xff, C]),
    op(op::MODE_SELECT_10, &[0x55, 0x11, 0, 0, 0, 0, 0, 0xff, 0xff, C]),
    op(op::RESERVE_10, &[0x56, 0, 0, 0, 0, 0, 0, 0, 0, C]),
    op(op::RELEASE_10, &[0x57, 0, 0, 0, 0, 0, 0, 0, 0, C]),
    op(op::MODE_SENSE_10, &[0x5a, 0x18, 0xff, 0xff, 0, 0, 0, 0xff, 0xff, C]),
    sa(op::PERSISTENT_RESERVE_IN, 0, &[0x5e, 0x1f, 0, 0, 0, 0, 0, 0xff, 0xff, C]),
    sa(op::PERSISTENT_RESERVE_IN, 1, &[0x5e, 0x1f, 0, 0, 0, 0, 0, 0xff, 0xff, C]),
    sa(op::PERSISTENT_RESERVE_IN, 2, &[0x5e, 0x1f, 0, 0, 0, 0, 0, 0xff, 0xff, C]),
    sa(op::PERSISTENT_RESERVE_IN, 3, &[0x5e, 0x1f, 0, 0, 0, 0, 0, 0xff, 0xff, C]),
    sa(op::PERSISTENT_RESERVE_OUT, 0, &[0x5f, 0x1f, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, C]),
    sa(op::PERSISTENT_RESERVE_OUT, 1, &[0x5f, 0x1f, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, C]),
    sa(op::PERSISTENT_RESERVE_OUT, 2, &[0x5f, 0x1f, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, C]),
    sa(op::PERSISTENT_RESERVE_OUT, 3, &[0x5f, 0x1f, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, C]),
    sa(op::PERSISTENT_RESERVE_OUT, 4, &[0x5f, 0x1f, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, C]),
    sa(op::PERSISTENT_RESERVE_OUT, 5, &[0x5f, 0x1f, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, C]),
    sa(op::PERSISTENT_RESERVE_OUT, 6, &[0x5f, 0x1f, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, C]),
    sa(op::PERSISTENT_RESERVE_OUT, 7, &[0x5f, 0x1f, 0xff, 0, 0, 0xff, 0xff, 0xff, 0xff, C]),
    op(op::READ_16, &[0x88, 0x1a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, C]),
    op(op::COMPARE_AND_WRITE, &[0x89, 0x1a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0xff, 0x1f, C]),
    op(op::WRITE_16, &[0x8a, 0x1a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, C]),
    op(op::WRITE_AND_VERIFY_16, &[0x8e, 0x12, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, C]),
    op(op::VERIFY_16, &[0x8f, 0x16, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, C]),
    op(op::PRE_FETCH_16, &[0x90, 0x02, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, C]),
    op(op::SYNCHRONIZE_CACHE_16, &[0x91, 0x06, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, C]),
    op(op::WRITE_SAME_16, &[0x93, 0x19, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, C]),
    sa(op::SERVICE_ACTION_IN_16, op::SA_READ_CAPACITY_16,
       &[0x9e, 0x1f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, C]),
    sa(op::SERVICE_ACTION_IN_16, op::SA_GET_LBA_STATUS,
       &[0x9e, 0x1f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, C]),
    op(op::REPORT_LUNS, &[0xa0, 0, 0xff, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, C]),
    sa(op::MAINTENANCE_IN, op::SA_REPORT_TARGET_PORT_GROUPS, &[0xa3, 0xff, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, C]),
    sa(op::MAINTENANCE_IN, op::SA_REPORT_SUPPORTED_OPCODES, &[0xa3, 0x1f, 0x87, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, C]),
    sa(op::MAINTENANCE_IN, op::SA_REPORT_SUPPORTED_TMFS, &[0xa3, 0x1f, 0x80, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0, C]),
    op(op::READ_12, &[0xa8, 0x1a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, C]),
    op(op::WRITE_12, &[0xaa, 0x1a, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, C]),
    op(op::WRITE_AND_VERIFY_12, &[0xae, 0x12, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, C]),
    op(op::VERIFY_12, &[0xaf, 0x16, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x1f, C]),
];

/// True for opcodes whose byte 1 holds a service action (in [`OPS`]).
pub fn has_service_actions(opcode: u8) -> bool {
    matches!(
        opcode,
        op::PERSISTENT_RESERVE_IN | op::PERSISTENT_RESERVE_OUT | op::SERVICE_ACTION_IN_16 | op::MAINTENANCE_IN
    )
}

/// The row of `opcode` (and `sa`, for opcodes with service actions).
pub fn lookup(opcode: u8, sa: u16) -> Option<&'static OpInfo> {
    OPS.iter().find(|o| o.opcode == opcode && o.sa.is_none_or(|s| s == sa))
}

/// Read/write parameters common to the block commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Rw {
    /// First logical block.
    pub lba: u64,
    /// Number of logical blocks (READ(6)/WRITE(6)'s zero is already 256).
    pub blocks: u32,
    /// Force unit access.
    pub fua: bool,
    /// Disable page out (a caching hint; accepted, nothing to do).
    pub dpo: bool,
}

/// A decoded command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// TEST UNIT READY.
    TestUnitReady,
    /// REQUEST SENSE.
    RequestSense {
        /// Descriptor format wanted.
        desc: bool,
        /// Allocation length.
        alloc: u32,
    },
    /// INQUIRY.
    Inquiry {
        /// A vital product data page (else the standard data).
        evpd: bool,
        /// The page.
        page: u8,
        /// Allocation length.
        alloc: u32,
    },
    /// MODE SENSE(6) and (10).
    ModeSense {
        /// MODE SENSE(10).
        ten: bool,
        /// Disable block descriptors.
        dbd: bool,
        /// Long LBA block descriptor (10 only).
        llbaa: bool,
        /// Page control: 0 current, 1 changeable, 2 default, 3 saved.
        pc: u8,
        /// Page code (3Fh: all).
        page: u8,
        /// Subpage code (FFh: all).
        subpage: u8,
        /// Allocation length.
        alloc: u32,
    },
    /// MODE SELECT(6) and (10).
    ModeSelect {
        /// MODE SELECT(10).
        ten: bool,
        /// Page format.
        pf: bool,
        /// Save pages.
        sp: bool,
        /// Parameter list length.
        len: u32,
    },
    /// RESERVE(6) and (10).
    Reserve {
        /// RESERVE(10).
        ten: bool,
    },
    /// RELEASE(6) and (10).
    Release {
        /// RELEASE(10).
        ten: bool,
    },
    /// START STOP UNIT.
    StartStopUnit {
        /// Immediate.
        immed: bool,
        /// Power condition (0: START is valid).
        power_condition: u8,
        /// Load or eject.
        loej: bool,
        /// Start (else stop).
        start: bool,
    },
    /// READ CAPACITY(10).
    ReadCapacity10,
    /// READ CAPACITY(16).
    ReadCapacity16 {
        /// Allocation length.
        alloc: u32,
    },
    /// GET LBA STATUS.
    GetLbaStatus {
        /// Starting LBA.
        lba: u64,
        /// Allocation length.
        alloc: u32,
    },
    /// READ(6/10/12/16).
    Read(Rw),
    /// WRITE(6/10/12/16).
    Write(Rw),
    /// WRITE AND VERIFY(10/12/16).
    WriteVerify {
        /// Range and flags.
        rw: Rw,
        /// Compare what was written with the data-out (else verify the medium).
        bytchk: bool,
    },
    /// VERIFY(10/12/16).
    Verify {
        /// Range and flags.
        rw: Rw,
        /// 0: medium only; 1: compare with `blocks` of data-out; 3: compare every block with
        /// one block of data-out.
        bytchk: u8,
    },
    /// COMPARE AND WRITE.
    CompareAndWrite(Rw),
    /// WRITE SAME(10/16).
    WriteSame {
        /// Range (0 blocks: refused, WSNZ is set).
        rw: Rw,
        /// Unmap the blocks if the data allows.
        unmap: bool,
        /// Anchor instead of unmapping.
        anchor: bool,
        /// No data-out buffer: zeroes (16 only).
        ndob: bool,
    },
    /// UNMAP.
    Unmap {
        /// Anchor the ranges instead.
        anchor: bool,
        /// Parameter list length.
        len: u32,
    },
    /// SYNCHRONIZE CACHE(10/16).
    SyncCache {
        /// First block.
        lba: u64,
        /// Blocks (0: to the end).
        blocks: u32,
    },
    /// PRE-FETCH(10/16).
    PreFetch {
        /// First block.
        lba: u64,
        /// Blocks (0: to the end).
        blocks: u32,
    },
    /// REPORT LUNS.
    ReportLuns {
        /// SELECT REPORT.
        select: u8,
        /// Allocation length.
        alloc: u32,
    },
    /// REPORT TARGET PORT GROUPS.
    ReportTargetPortGroups {
        /// Extended header format (parameter data format 001b).
        extended: bool,
        /// Allocation length.
        alloc: u32,
    },
    /// REPORT SUPPORTED OPERATION CODES.
    ReportOpcodes {
        /// Return command timeouts descriptors.
        rctd: bool,
        /// Reporting options.
        options: u8,
        /// Requested opcode.
        opcode: u8,
        /// Requested service action.
        sa: u16,
        /// Allocation length.
        alloc: u32,
    },
    /// REPORT SUPPORTED TASK MANAGEMENT FUNCTIONS.
    ReportTmfs {
        /// Return extended parameter data.
        repd: bool,
        /// Allocation length.
        alloc: u32,
    },
    /// PERSISTENT RESERVE IN.
    PrIn {
        /// Service action.
        sa: u8,
        /// Allocation length.
        alloc: u32,
    },
    /// PERSISTENT RESERVE OUT.
    PrOut {
        /// Service action.
        sa: u8,
        /// Scope.
        scope: u8,
        /// Type.
        rtype: u8,
        /// Parameter list length.
        len: u32,
    },
}

fn be(b: &[u8]) -> u64 {
    b.iter().fold(0, |v, &x| v << 8 | u64::from(x))
}

/// The highest bit set in `v` (`v` non-zero).
fn top_bit(v: u8) -> u8 {
    7 - v.leading_zeros() as u8
}

/// Decodes `cdb` (the transport may pad it: bytes past the command's length are ignored).
pub fn decode(cdb: &[u8]) -> Result<Command, Fault> {
    let Some(&opcode) = cdb.first() else { return Err(Fault::invalid_opcode()) };
    let info = if has_service_actions(opcode) {
        let sa = match cdb.get(1) {
            // REPORT TARGET PORT GROUPS keeps its data format in byte 1's top bits.
            Some(&b) => u16::from(b & 0x1f),
            None => return Err(Fault::invalid_cdb(1, Some(4))),
        };
        match lookup(opcode, sa) {
            Some(i) => i,
            None => return Err(Fault::invalid_cdb(1, Some(4))),
        }
    } else {
        lookup(opcode, 0).ok_or(Fault::invalid_opcode())?
    };
    let len = info.usage.len();
    if cdb.len() < len {
        return Err(Fault::invalid_cdb(cdb.len() as u16, None));
    }
    let c = &cdb[..len];
    for (i, (&b, &m)) in c.iter().zip(info.usage).enumerate().skip(1) {
        let extra = b & !m;
        if extra != 0 {
            return Err(Fault::invalid_cdb(i as u16, Some(top_bit(extra))));
        }
    }
    let b1 = c[1];
    let rw16 = || Rw { lba: be(&c[2..10]), blocks: be(&c[10..14]) as u32, fua: b1 & 0x08 != 0, dpo: b1 & 0x10 != 0 };
    let rw12 = || Rw { lba: be(&c[2..6]), blocks: be(&c[6..10]) as u32, fua: b1 & 0x08 != 0, dpo: b1 & 0x10 != 0 };
    let rw10 = || Rw { lba: be(&c[2..6]), blocks: be(&c[7..9]) as u32, fua: b1 & 0x08 != 0, dpo: b1 & 0x10 != 0 };
    let rw6 = || {
        let n = u32::from(c[4]);
        Rw { lba: be(&c[1..4]) & 0x1f_ffff, blocks: if n == 0 { 256 } else { n }, fua: false, dpo: false }
    };
    let verify = |rw: Rw| {
        let bytchk = (b1 >> 1) & 3;
        if bytchk == 2 {
            return Err(Fault::invalid_cdb(1, Some(2)));
        }
        Ok(Command::Verify { rw: Rw { fua: false, ..rw }, bytchk })
    };
    let write_verify = |rw: Rw| Command::WriteVerify { rw: Rw { fua: false, ..rw }, bytchk: b1 & 0x02 != 0 };
    let write_same = |rw: Rw, ndob: bool| {
        let (anchor, unmap) = (b1 & 0x10 != 0, b1 & 0x08 != 0);
        if anchor && !unmap {
            return Err(Fault::invalid_cdb(1, Some(4)));
        }
        if rw.blocks == 0 {
            // WSNZ: a zero NUMBER OF LOGICAL BLOCKS ("to the end") is not supported.
            let at = if c.len() == 16 { 10 } else { 7 };
            return Err(Fault::invalid_cdb(at, None));
        }
        Ok(Command::WriteSame { rw: Rw { fua: false, dpo: false, ..rw }, unmap, anchor, ndob })
    };
    Ok(match opcode {
        op::TEST_UNIT_READY => Command::TestUnitReady,
        op::REQUEST_SENSE => Command::RequestSense { desc: b1 & 1 != 0, alloc: u32::from(c[4]) },
        op::READ_6 => Command::Read(rw6()),
        op::WRITE_6 => Command::Write(rw6()),
        op::INQUIRY => {
            let evpd = b1 & 1 != 0;
            if !evpd && c[2] != 0 {
                return Err(Fault::invalid_cdb(2, Some(7)));
            }
            Command::Inquiry { evpd, page: c[2], alloc: be(&c[3..5]) as u32 }
        }
        op::MODE_SELECT_6 | op::MODE_SELECT_10 => {
            let ten = opcode == op::MODE_SELECT_10;
            if b1 & 1 != 0 {
                // SP: no page can be saved.
                return Err(Fault::invalid_cdb(1, Some(0)));
            }
            let len = if ten { be(&c[7..9]) } else { u64::from(c[4]) } as u32;
            Command::ModeSelect { ten, pf: b1 & 0x10 != 0, sp: false, len }
        }
        op::RESERVE_6 => Command::Reserve { ten: false },
        op::RESERVE_10 => Command::Reserve { ten: true },
        op::RELEASE_6 => Command::Release { ten: false },
        op::RELEASE_10 => Command::Release { ten: true },
        op::MODE_SENSE_6 | op::MODE_SENSE_10 => {
            let ten = opcode == op::MODE_SENSE_10;
            Command::ModeSense {
                ten,
                dbd: b1 & 0x08 != 0,
                llbaa: ten && b1 & 0x10 != 0,
                pc: c[2] >> 6,
                page: c[2] & 0x3f,
                subpage: c[3],
                alloc: if ten { be(&c[7..9]) as u32 } else { u32::from(c[4]) },
            }
        }
        op::START_STOP_UNIT => {
            let power_condition = c[4] >> 4;
            // SBC-3 table 68: START_VALID, ACTIVE, IDLE, STANDBY, LU_CONTROL, FORCE_IDLE_0,
            // FORCE_STANDBY_0; the rest are reserved.
            if !matches!(power_condition, 0 | 1 | 2 | 3 | 7 | 0xa | 0xb) {
                return Err(Fault::invalid_cdb(4, Some(7)));
            }
            Command::StartStopUnit { immed: b1 & 1 != 0, power_condition, loej: c[4] & 2 != 0, start: c[4] & 1 != 0 }
        }
        op::READ_CAPACITY_10 => {
            // Without PMI the LOGICAL BLOCK ADDRESS field must be zero (SBC-3 5.15).
            if c[8] & 1 == 0 && be(&c[2..6]) != 0 {
                return Err(Fault::invalid_cdb(2, None));
            }
            Command::ReadCapacity10
        }
        op::READ_10 => Command::Read(rw10()),
        op::WRITE_10 => Command::Write(rw10()),
        op::WRITE_AND_VERIFY_10 => write_verify(rw10()),
        op::VERIFY_10 => verify(rw10())?,
        op::PRE_FETCH_10 => Command::PreFetch { lba: be(&c[2..6]), blocks: be(&c[7..9]) as u32 },
        op::SYNCHRONIZE_CACHE_10 => Command::SyncCache { lba: be(&c[2..6]), blocks: be(&c[7..9]) as u32 },
        op::WRITE_SAME_10 => write_same(rw10(), false)?,
        op::UNMAP => Command::Unmap { anchor: b1 & 1 != 0, len: be(&c[7..9]) as u32 },
        op::PERSISTENT_RESERVE_IN => Command::PrIn { sa: b1 & 0x1f, alloc: be(&c[7..9]) as u32 },
        op::PERSISTENT_RESERVE_OUT => {
            Command::PrOut { sa: b1 & 0x1f, scope: c[2] >> 4, rtype: c[2] & 0x0f, len: be(&c[5..9]) as u32 }
        }
        op::READ_16 => Command::Read(rw16()),
        op::COMPARE_AND_WRITE => Command::CompareAndWrite(Rw { blocks: u32::from(c[13]), ..rw16() }),
        op::WRITE_16 => Command::Write(rw16()),
        op::WRITE_AND_VERIFY_16 => write_verify(rw16()),
        op::VERIFY_16 => verify(rw16())?,
        op::PRE_FETCH_16 => Command::PreFetch { lba: be(&c[2..10]), blocks: be(&c[10..14]) as u32 },
        op::SYNCHRONIZE_CACHE_16 => Command::SyncCache { lba: be(&c[2..10]), blocks: be(&c[10..14]) as u32 },
        op::WRITE_SAME_16 => write_same(rw16(), b1 & 1 != 0)?,
        op::SERVICE_ACTION_IN_16 => {
            let alloc = be(&c[10..14]) as u32;
            if u16::from(b1 & 0x1f) == op::SA_READ_CAPACITY_16 {
                if c[14] & 1 == 0 && be(&c[2..10]) != 0 {
                    return Err(Fault::invalid_cdb(2, None));
                }
                Command::ReadCapacity16 { alloc }
            } else {
                Command::GetLbaStatus { lba: be(&c[2..10]), alloc }
            }
        }
        op::REPORT_LUNS => Command::ReportLuns { select: c[2], alloc: be(&c[6..10]) as u32 },
        op::MAINTENANCE_IN => {
            let alloc = be(&c[6..10]) as u32;
            match u16::from(b1 & 0x1f) {
                op::SA_REPORT_TARGET_PORT_GROUPS => {
                    let format = b1 >> 5;
                    if format > 1 {
                        return Err(Fault::invalid_cdb(1, Some(7)));
                    }
                    Command::ReportTargetPortGroups { extended: format == 1, alloc }
                }
                op::SA_REPORT_SUPPORTED_OPCODES => {
                    let options = c[2] & 7;
                    if options > 3 {
                        return Err(Fault::invalid_cdb(2, Some(2)));
                    }
                    Command::ReportOpcodes {
                        rctd: c[2] & 0x80 != 0,
                        options,
                        opcode: c[3],
                        sa: be(&c[4..6]) as u16,
                        alloc,
                    }
                }
                _ => Command::ReportTmfs { repd: c[2] & 0x80 != 0, alloc },
            }
        }
        op::READ_12 => Command::Read(rw12()),
        op::WRITE_12 => Command::Write(rw12()),
        op::WRITE_AND_VERIFY_12 => write_verify(rw12()),
        op::VERIFY_12 => verify(rw12())?,
        _ => return Err(Fault::invalid_opcode()),
    })
}

impl Command {
    /// The bytes of data-out the command takes (its parameter list or blocks), for a logical
    /// unit of `block_size`: what the transport gathers before the command runs (at most the
    /// transport's expected length; see `Session::data_out_len`).
    pub fn data_out_len(&self, block_size: u32) -> u64 {
        let bs = u64::from(block_size);
        match *self {
            Command::Write(rw) | Command::WriteVerify { rw, .. } => u64::from(rw.blocks) * bs,
            Command::Verify { rw, bytchk: 1 } => u64::from(rw.blocks) * bs,
            Command::Verify { rw, bytchk: 3 } if rw.blocks > 0 => bs,
            Command::CompareAndWrite(rw) => 2 * u64::from(rw.blocks) * bs,
            Command::WriteSame { ndob: false, .. } => bs,
            Command::Unmap { len, .. } | Command::ModeSelect { len, .. } | Command::PrOut { len, .. } => u64::from(len),
            _ => 0,
        }
    }

    /// True for commands whose data-out must be exactly [`Command::data_out_len`] long
    /// (SBC-4: COMPARE AND WRITE and WRITE SAME refuse any other expected length).
    pub fn exact_data_out(&self) -> bool {
        matches!(self, Command::CompareAndWrite(_) | Command::WriteSame { ndob: false, .. })
    }

    /// How the command's data-out fits the transport's expected length `expected`
    /// (iSCSI EDTL), as SAM-5 5.4.3 and FCP-4 9.4.2 let a device server choose: the command
    /// to run, or None when it must be refused whatever data comes.
    ///
    /// - A data-out that fits is transferred as it is (an expected length beyond it is an
    ///   underflow, which the response reports).
    /// - WRITE and WRITE AND VERIFY with more blocks than `expected` holds (FCP-4's choice
    ///   (a), which libiscsi's residual tests require): only the whole blocks `expected`
    ///   holds are transferred and written, and the response reports the rest as overflow.
    ///   An `expected` that is not a whole number of blocks is refused (choice (b)).
    /// - Any other command with more data-out than `expected`, and a command of
    ///   [`Command::exact_data_out`] with another length, is refused.
    pub fn fit_data_out(self, expected: u32, block_size: u32) -> Option<Command> {
        let need = self.data_out_len(block_size);
        let e = u64::from(expected);
        if self.exact_data_out() {
            return (need == e).then_some(self);
        }
        if need <= e {
            return Some(self);
        }
        if !expected.is_multiple_of(block_size) {
            return None;
        }
        let clip = |rw: Rw| Rw { blocks: expected / block_size, ..rw };
        match self {
            Command::Write(rw) => Some(Command::Write(clip(rw))),
            Command::WriteVerify { rw, bytchk } => Some(Command::WriteVerify { rw: clip(rw), bytchk }),
            _ => None,
        }
    }

    /// True for commands that move blocks in (reads): their data-in is `blocks` blocks, not
    /// bounded by an allocation length.
    pub fn is_read(&self) -> bool {
        matches!(self, Command::Read(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sense::{FieldPointer, SENSE_ILLEGAL_REQUEST};

    #[test]
    fn every_row_is_well_formed() {
        for (i, o) in OPS.iter().enumerate() {
            assert_eq!(o.usage[0], o.opcode, "usage data starts with the opcode");
            assert!(matches!(o.usage.len(), 6 | 10 | 12 | 16), "{:#x}: CDB length", o.opcode);
            assert_eq!(o.sa.is_some(), has_service_actions(o.opcode), "{:#x}", o.opcode);
            if let Some(next) = OPS.get(i + 1) {
                assert!((o.opcode, o.sa) < (next.opcode, next.sa), "sorted");
            }
        }
    }

    #[test]
    fn reads_and_writes() {
        let c = decode(&[0x28, 0x18, 0, 0, 1, 0, 0, 0, 8, 0]).unwrap();
        assert_eq!(c, Command::Read(Rw { lba: 256, blocks: 8, fua: true, dpo: true }));
        let c = decode(&[0x0a, 0x01, 0x02, 0x03, 0, 0]).unwrap();
        assert_eq!(c, Command::Write(Rw { lba: 0x10203, blocks: 256, fua: false, dpo: false }));
        let mut w16 = [0u8; 16];
        w16[0] = 0x8a;
        w16[9] = 7;
        w16[13] = 2;
        assert_eq!(decode(&w16).unwrap(), Command::Write(Rw { lba: 7, blocks: 2, ..Default::default() }));
        assert_eq!(Command::Write(Rw { blocks: 2, ..Default::default() }).data_out_len(512), 1024);
    }

    #[test]
    fn protection_fields_and_reserved_bits_are_invalid_with_a_pointer() {
        let f = decode(&[0x28, 0x20, 0, 0, 0, 0, 0, 0, 1, 0]).unwrap_err();
        assert_eq!(f.sense.key, SENSE_ILLEGAL_REQUEST);
        assert_eq!((f.sense.asc, f.sense.ascq), (0x24, 0));
        assert_eq!(f.field, Some(FieldPointer { in_cdb: true, byte: 1, bit: Some(5) }));
        let f = decode(&[0x00, 0, 0, 0, 0, 0x04]).unwrap_err();
        assert_eq!(f.field, Some(FieldPointer { in_cdb: true, byte: 5, bit: Some(2) }), "NACA");
    }

    #[test]
    fn unknown_opcodes_and_service_actions() {
        assert_eq!(decode(&[0xc0, 0, 0, 0, 0, 0]).unwrap_err(), Fault::invalid_opcode());
        assert_eq!(decode(&[]).unwrap_err(), Fault::invalid_opcode());
        let f = decode(&[0x5e, 0x04, 0, 0, 0, 0, 0, 0, 0, 0]).unwrap_err();
        assert_eq!(f.field, Some(FieldPointer { in_cdb: true, byte: 1, bit: Some(4) }));
        let f = decode(&[0x28, 0, 0]).unwrap_err();
        assert_eq!(f.field.map(|p| p.byte), Some(3), "too short");
    }

    #[test]
    fn write_same_rules() {
        let ws = |b1: u8, n: u8| decode(&[0x41, b1, 0, 0, 0, 0, 0, 0, n, 0]);
        assert!(matches!(ws(0x10, 1).unwrap_err().field, Some(FieldPointer { byte: 1, .. })), "ANCHOR without UNMAP");
        assert!(ws(0, 0).is_err(), "WSNZ");
        assert_eq!(
            ws(0x08, 3).unwrap(),
            Command::WriteSame { rw: Rw { blocks: 3, ..Default::default() }, unmap: true, anchor: false, ndob: false }
        );
    }
}
