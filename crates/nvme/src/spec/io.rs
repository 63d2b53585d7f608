//! Command dword fields of the NVM command set's I/O commands (NVM Command Set Specification
//! 1.0: section 3.2.2 Compare, 3.2.3 Dataset Management, 3.2.4 Read, 3.2.6 Write, 3.2.8 Write
//! Zeroes; SPDK `union spdk_nvme_cmd_cdw12` and `struct spdk_nvme_dsm_range`).
//!
//! Each command is a view over an [`Sqe`]: `from_sqe` reads its fields out of CDW10-15 and
//! `apply` writes them back, leaving the rest of the entry (opcode, CID, NSID, data pointer)
//! to the caller.

use super::le::{bit, bits, flag, place, put_u32, put_u64, u32_at, u64_at};
use super::sqe::Sqe;

/// Read, Write and Compare: CDW10-11 SLBA, CDW12 NLB and flags, CDW13 dataset management and
/// directive specific, CDW14 reference tag, CDW15 application tag and mask (NVM Command Set
/// 1.0 figures 31-33 (Compare), 44-48 (Read), 61-64 (Write)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RwCommand {
    /// Starting LBA (SLBA, CDW10-11).
    pub slba: u64,
    /// Number of Logical Blocks (NLB, CDW12 bits 15:0), 0-based: 0 means one block.
    pub nlb: u16,
    /// Directive Type (DTYPE, CDW12 bits 23:20; Write only). Four bits.
    pub dtype: u8,
    /// Storage Tag Check (STC, CDW12 bit 24).
    pub stc: bool,
    /// Protection Information field (PRINFO, CDW12 bits 29:26): bit 3 PRACT, bits 2:0 PRCHK
    /// (guard, application tag, reference tag). Four bits.
    pub prinfo: u8,
    /// Force Unit Access (FUA, CDW12 bit 30).
    pub fua: bool,
    /// Limited Retry (LR, CDW12 bit 31).
    pub lr: bool,
    /// Dataset Management hints (DSM, CDW13 bits 7:0; Read and Write).
    pub dsm: u8,
    /// Directive Specific (DSPEC, CDW13 bits 31:16; Write only).
    pub dspec: u16,
    /// Initial (or Expected Initial) Logical Block Reference Tag (ILBRT/EILBRT, CDW14).
    pub reftag: u32,
    /// Logical Block Application Tag (LBAT/ELBAT, CDW15 bits 15:0).
    pub apptag: u16,
    /// Logical Block Application Tag Mask (LBATM/ELBATM, CDW15 bits 31:16).
    pub appmask: u16,
}

impl RwCommand {
    /// Number of blocks the command covers (NLB + 1).
    pub const fn blocks(&self) -> u32 {
        self.nlb as u32 + 1
    }

    /// Reads the fields from `sqe`.
    pub const fn from_sqe(sqe: &Sqe) -> RwCommand {
        RwCommand {
            slba: sqe.cdw10 as u64 | (sqe.cdw11 as u64) << 32,
            nlb: bits(sqe.cdw12, 0, 16) as u16,
            dtype: bits(sqe.cdw12, 20, 4) as u8,
            stc: bit(sqe.cdw12, 24),
            prinfo: bits(sqe.cdw12, 26, 4) as u8,
            fua: bit(sqe.cdw12, 30),
            lr: bit(sqe.cdw12, 31),
            dsm: bits(sqe.cdw13, 0, 8) as u8,
            dspec: bits(sqe.cdw13, 16, 16) as u16,
            reftag: sqe.cdw14,
            apptag: bits(sqe.cdw15, 0, 16) as u16,
            appmask: bits(sqe.cdw15, 16, 16) as u16,
        }
    }

    /// Writes the fields into `sqe`'s CDW10-15.
    pub fn apply(&self, sqe: &mut Sqe) {
        sqe.cdw10 = self.slba as u32;
        sqe.cdw11 = (self.slba >> 32) as u32;
        sqe.cdw12 = self.nlb as u32
            | place(self.dtype as u32, 20, 4)
            | flag(self.stc, 24)
            | place(self.prinfo as u32, 26, 4)
            | flag(self.fua, 30)
            | flag(self.lr, 31);
        sqe.cdw13 = self.dsm as u32 | (self.dspec as u32) << 16;
        sqe.cdw14 = self.reftag;
        sqe.cdw15 = self.apptag as u32 | (self.appmask as u32) << 16;
    }
}

/// Bits of [`RwCommand::prinfo`] and [`WriteZeroesCommand::prinfo`].
pub mod prinfo {
    /// PRCHK bit 0: check the reference tag.
    pub const PRCHK_REFTAG: u8 = 1 << 0;
    /// PRCHK bit 1: check the application tag.
    pub const PRCHK_APPTAG: u8 = 1 << 1;
    /// PRCHK bit 2: check the guard.
    pub const PRCHK_GUARD: u8 = 1 << 2;
    /// PRACT: the controller inserts or strips protection information.
    pub const PRACT: u8 = 1 << 3;
}

/// Write Zeroes: like Write without data, plus Deallocate (NVM Command Set 1.0 figures 71-73).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct WriteZeroesCommand {
    /// Starting LBA (SLBA, CDW10-11).
    pub slba: u64,
    /// Number of Logical Blocks (NLB, CDW12 bits 15:0), 0-based.
    pub nlb: u16,
    /// Storage Tag Check (STC, CDW12 bit 24).
    pub stc: bool,
    /// Deallocate (DEAC, CDW12 bit 25): the host prefers the blocks deallocated.
    pub deac: bool,
    /// Protection Information field (PRINFO, CDW12 bits 29:26); see [`prinfo`].
    pub prinfo: u8,
    /// Force Unit Access (FUA, CDW12 bit 30).
    pub fua: bool,
    /// Limited Retry (LR, CDW12 bit 31).
    pub lr: bool,
    /// Initial Logical Block Reference Tag (ILBRT, CDW14).
    pub reftag: u32,
    /// Logical Block Application Tag (LBAT, CDW15 bits 15:0).
    pub apptag: u16,
    /// Logical Block Application Tag Mask (LBATM, CDW15 bits 31:16).
    pub appmask: u16,
}

impl WriteZeroesCommand {
    /// Number of blocks the command covers (NLB + 1).
    pub const fn blocks(&self) -> u32 {
        self.nlb as u32 + 1
    }

    /// Reads the fields from `sqe`.
    pub const fn from_sqe(sqe: &Sqe) -> WriteZeroesCommand {
        WriteZeroesCommand {
            slba: sqe.cdw10 as u64 | (sqe.cdw11 as u64) << 32,
            nlb: bits(sqe.cdw12, 0, 16) as u16,
            stc: bit(sqe.cdw12, 24),
            deac: bit(sqe.cdw12, 25),
            prinfo: bits(sqe.cdw12, 26, 4) as u8,
            fua: bit(sqe.cdw12, 30),
            lr: bit(sqe.cdw12, 31),
            reftag: sqe.cdw14,
            apptag: bits(sqe.cdw15, 0, 16) as u16,
            appmask: bits(sqe.cdw15, 16, 16) as u16,
        }
    }

    /// Writes the fields into `sqe`'s CDW10-15 (CDW13 is reserved and cleared).
    pub fn apply(&self, sqe: &mut Sqe) {
        sqe.cdw10 = self.slba as u32;
        sqe.cdw11 = (self.slba >> 32) as u32;
        sqe.cdw12 = self.nlb as u32
            | flag(self.stc, 24)
            | flag(self.deac, 25)
            | place(self.prinfo as u32, 26, 4)
            | flag(self.fua, 30)
            | flag(self.lr, 31);
        sqe.cdw13 = 0;
        sqe.cdw14 = self.reftag;
        sqe.cdw15 = self.apptag as u32 | (self.appmask as u32) << 16;
    }
}

/// Dataset Management: CDW10 Number of Ranges, CDW11 attributes (NVM Command Set 1.0 figures
/// 38-39). The ranges travel as data, [`DsmRange::SIZE`] bytes each.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DsmCommand {
    /// Number of Ranges (NR, CDW10 bits 7:0), 0-based: 0 means one range.
    pub nr: u8,
    /// Attribute – Integral Dataset for Read (IDR, CDW11 bit 0).
    pub idr: bool,
    /// Attribute – Integral Dataset for Write (IDW, CDW11 bit 1).
    pub idw: bool,
    /// Attribute – Deallocate (AD, CDW11 bit 2).
    pub ad: bool,
}

impl DsmCommand {
    /// Largest number of ranges one command carries (NR is 0-based and 8 bits).
    pub const MAX_RANGES: usize = 256;

    /// Number of ranges (NR + 1).
    pub const fn ranges(&self) -> usize {
        self.nr as usize + 1
    }

    /// Bytes of range data the command transfers.
    pub const fn data_len(&self) -> usize {
        self.ranges() * DsmRange::SIZE
    }

    /// Reads the fields from `sqe`.
    pub const fn from_sqe(sqe: &Sqe) -> DsmCommand {
        DsmCommand {
            nr: bits(sqe.cdw10, 0, 8) as u8,
            idr: bit(sqe.cdw11, 0),
            idw: bit(sqe.cdw11, 1),
            ad: bit(sqe.cdw11, 2),
        }
    }

    /// Writes the fields into `sqe`'s CDW10-11.
    pub fn apply(&self, sqe: &mut Sqe) {
        sqe.cdw10 = self.nr as u32;
        sqe.cdw11 = flag(self.idr, 0) | flag(self.idw, 1) | flag(self.ad, 2);
    }
}

/// One Dataset Management range (NVM Command Set 1.0 figure 40, "Dataset Management – Range
/// Definition"; SPDK `struct spdk_nvme_dsm_range`, Linux `struct nvme_dsm_range`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct DsmRange {
    /// Context Attributes (bytes 3:0); see [`dsm_cattr`].
    pub context_attributes: u32,
    /// Length in logical blocks (bytes 7:4). Unlike NLB in the I/O commands this count is
    /// not 0-based.
    pub nlb: u32,
    /// Starting LBA (bytes 15:8).
    pub slba: u64,
}

impl DsmRange {
    /// Size in bytes.
    pub const SIZE: usize = 16;
    /// Byte offset of the context attributes.
    pub const OFFSET_CATTR: usize = 0;
    /// Byte offset of the length.
    pub const OFFSET_NLB: usize = 4;
    /// Byte offset of the starting LBA.
    pub const OFFSET_SLBA: usize = 8;

    /// Writes the range.
    pub fn encode(&self, out: &mut [u8; Self::SIZE]) {
        put_u32(out, Self::OFFSET_CATTR, self.context_attributes);
        put_u32(out, Self::OFFSET_NLB, self.nlb);
        put_u64(out, Self::OFFSET_SLBA, self.slba);
    }

    /// The range's bytes.
    pub fn to_bytes(&self) -> [u8; Self::SIZE] {
        let mut b = [0; Self::SIZE];
        self.encode(&mut b);
        b
    }

    /// Reads a range.
    pub fn decode(b: &[u8; Self::SIZE]) -> DsmRange {
        DsmRange {
            context_attributes: u32_at(b, Self::OFFSET_CATTR),
            nlb: u32_at(b, Self::OFFSET_NLB),
            slba: u64_at(b, Self::OFFSET_SLBA),
        }
    }

    /// The first `count` ranges in `data`, or fewer if `data` ends first (a short buffer yields
    /// only the complete ranges it holds).
    pub fn iter(data: &[u8], count: usize) -> impl Iterator<Item = DsmRange> + '_ {
        data.chunks_exact(Self::SIZE)
            .take(count)
            .filter_map(|c| c.first_chunk::<{ Self::SIZE }>().map(DsmRange::decode))
    }

    /// Writes `ranges` one after another into `out`; returns how many fitted.
    pub fn write_all(ranges: &[DsmRange], out: &mut [u8]) -> usize {
        let mut n = 0;
        for (r, chunk) in ranges.iter().zip(out.chunks_exact_mut(Self::SIZE)) {
            if let Some(c) = chunk.first_chunk_mut::<{ Self::SIZE }>() {
                r.encode(c);
                n += 1;
            }
        }
        n
    }
}

/// Context attribute bits of a [`DsmRange`] (NVM Command Set 1.0 figure 41).
pub mod dsm_cattr {
    /// Access Frequency (bits 3:0) mask.
    pub const ACCESS_FREQUENCY_MASK: u32 = 0xf;
    /// Access Latency (bits 5:4) mask.
    pub const ACCESS_LATENCY_MASK: u32 = 0x3 << 4;
    /// Sequential Read Range (bit 8).
    pub const SEQUENTIAL_READ: u32 = 1 << 8;
    /// Sequential Write Range (bit 9).
    pub const SEQUENTIAL_WRITE: u32 = 1 << 9;
    /// Write Prepare (bit 10).
    pub const WRITE_PREPARE: u32 = 1 << 10;
    /// Command Access Size (bits 31:24) mask, in logical blocks.
    pub const ACCESS_SIZE_MASK: u32 = 0xff << 24;
}

#[cfg(test)]
mod tests {
    use super::super::opcode::nvm;
    use super::super::sqe::tests::sqe;
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rw_bits_match_spdk_cdw12_write_and_linux_control() {
        let rw = RwCommand {
            slba: 0x1122_3344_5566_7788,
            nlb: 7,
            dtype: 1,
            stc: true,
            prinfo: prinfo::PRACT | prinfo::PRCHK_GUARD,
            fua: true,
            lr: false,
            dsm: 0x42,
            dspec: 0xbeef,
            reftag: 0xdead_0001,
            apptag: 0x1234,
            appmask: 0xffff,
        };
        let mut s = Sqe::new(nvm::WRITE, 1, 1);
        rw.apply(&mut s);
        let b = s.to_bytes();
        // SLBA at bytes 40..48, NLB at 48..50 (0-based), control at 50..52.
        assert_eq!(&b[40..48], &0x1122_3344_5566_7788u64.to_le_bytes());
        assert_eq!(&b[48..50], &[7, 0]);
        // Linux control halfword: DTYPE_STREAMS 1<<4, PRACT 1<<13, PRCHK_GUARD 1<<12,
        // FUA 1<<14; SPDK: stc bit 24 of CDW12 = bit 8 of the control halfword.
        let control = u16::from_le_bytes([b[50], b[51]]);
        assert_eq!(control, 1 << 4 | 1 << 8 | 1 << 12 | 1 << 13 | 1 << 14);
        assert_eq!(&b[52..56], &[0x42, 0, 0xef, 0xbe]);
        assert_eq!(&b[56..60], &0xdead_0001u32.to_le_bytes());
        assert_eq!(&b[60..64], &[0x34, 0x12, 0xff, 0xff]);
        assert_eq!(RwCommand::from_sqe(&Sqe::decode(&b)), rw);
        assert_eq!(rw.blocks(), 8);
        let lr = RwCommand { lr: true, ..RwCommand::default() };
        lr.apply(&mut s);
        assert_eq!(s.cdw12, 1 << 31);
    }

    #[test]
    fn write_zeroes_deac_is_bit_25() {
        // SPDK write_zeroes: nlb:16, reserved:8, stc:1, deac:1; Linux NVME_WZ_DEAC 1<<9 of control.
        let wz = WriteZeroesCommand { slba: 5, nlb: 0xffff, deac: true, ..Default::default() };
        let mut s = Sqe::new(nvm::WRITE_ZEROES, 1, 1);
        s.cdw13 = 0x55;
        wz.apply(&mut s);
        assert_eq!(s.cdw12, 0x0200_ffff);
        assert_eq!(s.cdw13, 0);
        assert_eq!(WriteZeroesCommand::from_sqe(&s), wz);
        assert_eq!(wz.blocks(), 0x1_0000);
    }

    #[test]
    fn dsm_fields_and_ranges() {
        // SPDK dsm cdw10 nr:8; cdw11 idr:1 idw:1 ad:1; Linux NVME_DSMGMT_AD 1<<2.
        let d = DsmCommand { nr: 1, ad: true, ..Default::default() };
        let mut s = Sqe::new(nvm::DATASET_MANAGEMENT, 1, 1);
        d.apply(&mut s);
        assert_eq!((s.cdw10, s.cdw11), (1, 4));
        assert_eq!(DsmCommand::from_sqe(&s), d);
        assert_eq!((d.ranges(), d.data_len()), (2, 32));
        // SPDK_STATIC_ASSERT(sizeof(struct spdk_nvme_dsm_range) == 16); attributes 0,
        // length 4, starting_lba 8.
        let r = DsmRange { context_attributes: 0x0403_0201, nlb: 0x0807_0605, slba: 0x100f_0e0d_0c0b_0a09 };
        let b = r.to_bytes();
        assert_eq!(b, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]);
        let mut buf = [0u8; 40];
        assert_eq!(DsmRange::write_all(&[r, r, r], &mut buf), 2);
        let got: Vec<_> = DsmRange::iter(&buf, 5).collect();
        assert_eq!(got, vec![r, r]);
        assert_eq!(DsmRange::iter(&buf, 1).count(), 1);
        assert_eq!(DsmRange::iter(&buf[..15], 1).count(), 0);
    }

    proptest! {
        #[test]
        fn rw_round_trip(s in sqe()) {
            // Reading and writing back keeps every field RwCommand defines.
            let rw = RwCommand::from_sqe(&s);
            let mut t = s;
            rw.apply(&mut t);
            prop_assert_eq!(RwCommand::from_sqe(&t), rw);
            let wz = WriteZeroesCommand::from_sqe(&s);
            wz.apply(&mut t);
            prop_assert_eq!(WriteZeroesCommand::from_sqe(&t), wz);
            let d = DsmCommand::from_sqe(&s);
            d.apply(&mut t);
            prop_assert_eq!(DsmCommand::from_sqe(&t), d);
        }

        #[test]
        fn dsm_ranges_any_bytes(data in proptest::collection::vec(any::<u8>(), 0..100), n in 0usize..10) {
            let ranges: Vec<_> = DsmRange::iter(&data, n).collect();
            prop_assert_eq!(ranges.len(), n.min(data.len() / 16));
            let mut out = vec![0u8; ranges.len() * 16];
            prop_assert_eq!(DsmRange::write_all(&ranges, &mut out), ranges.len());
            prop_assert_eq!(&out[..], &data[..out.len()]);
        }
    }
}
