//! The 64-byte submission queue entry (NVMe Base Specification 2.0, section 4.2 "Submission
//! Queue Entry", figures 86-87; SPDK `struct spdk_nvme_cmd`). Over fabrics it is the command
//! capsule's SQE. Field meanings per command are in [`super::io`] and [`super::admin`]; Fabrics
//! commands (opcode 7Fh) have their own layouts in [`super::fabrics`].

use super::le::{put_u16, put_u32, put_u64, u16_at, u32_at, u64_at};
use super::sgl::SglDescriptor;

/// Fused Operation (FUSE, bits 1:0 of byte 1; NVMe 2.0 figure 87).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Fuse {
    /// 00b: normal operation.
    #[default]
    Normal,
    /// 01b: first command of a fused operation (Compare of Compare and Write).
    First,
    /// 10b: second command of a fused operation.
    Second,
    /// 11b: reserved.
    Reserved,
}

impl Fuse {
    /// The two-bit field value.
    pub const fn bits(self) -> u8 {
        self as u8
    }

    /// The variant for the low two bits of `v`.
    pub const fn from_bits(v: u8) -> Fuse {
        match v & 3 {
            0 => Fuse::Normal,
            1 => Fuse::First,
            2 => Fuse::Second,
            _ => Fuse::Reserved,
        }
    }
}

/// PRP or SGL for Data Transfer (PSDT, bits 7:6 of byte 1; NVMe 2.0 figure 87). Fabrics
/// commands always use SGLs; Linux's fabrics hosts send 01b (`NVME_CMD_SGL_METABUF`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Psdt {
    /// 00b: PRPs (PCIe only).
    #[default]
    Prp,
    /// 01b: SGLs; MPTR is the address of a contiguous metadata buffer.
    SglMptrContiguous,
    /// 10b: SGLs; MPTR is the address of an SGL segment with one descriptor.
    SglMptrSgl,
    /// 11b: reserved.
    Reserved,
}

impl Psdt {
    /// The two-bit field value.
    pub const fn bits(self) -> u8 {
        self as u8
    }

    /// The variant for the low two bits of `v`.
    pub const fn from_bits(v: u8) -> Psdt {
        match v & 3 {
            0 => Psdt::Prp,
            1 => Psdt::SglMptrContiguous,
            2 => Psdt::SglMptrSgl,
            _ => Psdt::Reserved,
        }
    }
}

/// Data Pointer (DPTR, bytes 39:24): two PRP entries when PSDT is 00b, else SGL Entry 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataPointer {
    /// PRP Entry 1 and 2.
    Prp {
        /// PRP Entry 1 (bytes 31:24).
        prp1: u64,
        /// PRP Entry 2 (bytes 39:32).
        prp2: u64,
    },
    /// SGL Entry 1.
    Sgl(SglDescriptor),
}

impl Default for DataPointer {
    fn default() -> Self {
        DataPointer::Sgl(SglDescriptor::default())
    }
}

/// A submission queue entry. `cdw10`-`cdw15` are kept raw; the per-command views in
/// [`super::io`] and [`super::admin`] read and write them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Sqe {
    /// Opcode (OPC, byte 0); see [`super::opcode`].
    pub opcode: u8,
    /// Fused Operation (byte 1 bits 1:0). Bits 5:2 of byte 1 are reserved.
    pub fuse: Fuse,
    /// PRP or SGL for Data Transfer (byte 1 bits 7:6). Decides how [`Sqe::dptr`] is read.
    pub psdt: Psdt,
    /// Command Identifier (CID, bytes 3:2).
    pub cid: u16,
    /// Namespace Identifier (NSID, bytes 7:4). For Fabrics commands byte 4 is FCTYPE.
    pub nsid: u32,
    /// Command Dword 2 (bytes 11:8), command specific.
    pub cdw2: u32,
    /// Command Dword 3 (bytes 15:12), command specific.
    pub cdw3: u32,
    /// Metadata Pointer (MPTR, bytes 23:16).
    pub mptr: u64,
    /// Data Pointer (DPTR, bytes 39:24).
    pub dptr: DataPointer,
    /// Command Dword 10 (bytes 43:40).
    pub cdw10: u32,
    /// Command Dword 11 (bytes 47:44).
    pub cdw11: u32,
    /// Command Dword 12 (bytes 51:48).
    pub cdw12: u32,
    /// Command Dword 13 (bytes 55:52).
    pub cdw13: u32,
    /// Command Dword 14 (bytes 59:56).
    pub cdw14: u32,
    /// Command Dword 15 (bytes 63:60).
    pub cdw15: u32,
}

impl Sqe {
    /// Size in bytes.
    pub const SIZE: usize = 64;
    /// Byte offset of the opcode.
    pub const OFFSET_OPCODE: usize = 0;
    /// Byte offset of the byte holding FUSE (bits 1:0) and PSDT (bits 7:6).
    pub const OFFSET_FLAGS: usize = 1;
    /// Byte offset of CID.
    pub const OFFSET_CID: usize = 2;
    /// Byte offset of NSID.
    pub const OFFSET_NSID: usize = 4;
    /// Byte offset of CDW2.
    pub const OFFSET_CDW2: usize = 8;
    /// Byte offset of CDW3.
    pub const OFFSET_CDW3: usize = 12;
    /// Byte offset of MPTR.
    pub const OFFSET_MPTR: usize = 16;
    /// Byte offset of DPTR.
    pub const OFFSET_DPTR: usize = 24;
    /// Byte offset of CDW10; CDW11-15 follow every 4 bytes.
    pub const OFFSET_CDW10: usize = 40;

    /// A command with `opcode`, `cid` and `nsid`, SGL data pointer and every other field zero.
    pub fn new(opcode: u8, cid: u16, nsid: u32) -> Sqe {
        Sqe {
            opcode,
            psdt: Psdt::SglMptrContiguous,
            cid,
            nsid,
            dptr: DataPointer::Sgl(SglDescriptor::default()),
            ..Sqe::default()
        }
    }

    /// The SGL data pointer, unless PSDT selects PRPs.
    pub fn sgl(&self) -> Option<SglDescriptor> {
        match self.dptr {
            DataPointer::Sgl(d) => Some(d),
            DataPointer::Prp { .. } => None,
        }
    }

    /// Command dwords 10-15 as an array (index 0 is CDW10).
    pub const fn cdws(&self) -> [u32; 6] {
        [self.cdw10, self.cdw11, self.cdw12, self.cdw13, self.cdw14, self.cdw15]
    }

    /// Writes the entry.
    pub fn encode(&self, out: &mut [u8; Self::SIZE]) {
        out[Self::OFFSET_OPCODE] = self.opcode;
        out[Self::OFFSET_FLAGS] = self.fuse.bits() | self.psdt.bits() << 6;
        put_u16(out, Self::OFFSET_CID, self.cid);
        put_u32(out, Self::OFFSET_NSID, self.nsid);
        put_u32(out, Self::OFFSET_CDW2, self.cdw2);
        put_u32(out, Self::OFFSET_CDW3, self.cdw3);
        put_u64(out, Self::OFFSET_MPTR, self.mptr);
        match self.dptr {
            DataPointer::Prp { prp1, prp2 } => {
                put_u64(out, Self::OFFSET_DPTR, prp1);
                put_u64(out, Self::OFFSET_DPTR + 8, prp2);
            }
            DataPointer::Sgl(d) => {
                let mut b = [0; SglDescriptor::SIZE];
                d.encode(&mut b);
                out[Self::OFFSET_DPTR..Self::OFFSET_DPTR + SglDescriptor::SIZE].copy_from_slice(&b);
            }
        }
        for (i, v) in self.cdws().into_iter().enumerate() {
            put_u32(out, Self::OFFSET_CDW10 + 4 * i, v);
        }
    }

    /// The entry's bytes.
    pub fn to_bytes(&self) -> [u8; Self::SIZE] {
        let mut b = [0; Self::SIZE];
        self.encode(&mut b);
        b
    }

    /// Reads an entry; every byte pattern is a valid entry. The data pointer is read as PRPs
    /// when PSDT is 00b and as an SGL descriptor otherwise.
    pub fn decode(b: &[u8; Self::SIZE]) -> Sqe {
        let mut sqe = Sqe::decode_fields(b);
        sqe.dptr = match sqe.psdt {
            Psdt::Prp => {
                DataPointer::Prp { prp1: u64_at(b, Self::OFFSET_DPTR), prp2: u64_at(b, Self::OFFSET_DPTR + 8) }
            }
            _ => {
                let mut d = [0; SglDescriptor::SIZE];
                d.copy_from_slice(&b[Self::OFFSET_DPTR..Self::OFFSET_DPTR + SglDescriptor::SIZE]);
                DataPointer::Sgl(SglDescriptor::decode(&d))
            }
        };
        sqe
    }

    /// Reads every field but the data pointer, which is left as the default SGL descriptor:
    /// for a receiver that reads SGL Entry 1 from the bytes itself (a Fabrics target, per
    /// command). Building the data pointer's enum and copying it about cost a target's
    /// capsule path several stalled loads per command.
    pub fn decode_fields(b: &[u8; Self::SIZE]) -> Sqe {
        let flags = b[Self::OFFSET_FLAGS];
        let cdw = |i: usize| u32_at(b, Self::OFFSET_CDW10 + 4 * i);
        Sqe {
            opcode: b[Self::OFFSET_OPCODE],
            fuse: Fuse::from_bits(flags),
            psdt: Psdt::from_bits(flags >> 6),
            cid: u16_at(b, Self::OFFSET_CID),
            nsid: u32_at(b, Self::OFFSET_NSID),
            cdw2: u32_at(b, Self::OFFSET_CDW2),
            cdw3: u32_at(b, Self::OFFSET_CDW3),
            mptr: u64_at(b, Self::OFFSET_MPTR),
            dptr: DataPointer::default(),
            cdw10: cdw(0),
            cdw11: cdw(1),
            cdw12: cdw(2),
            cdw13: cdw(3),
            cdw14: cdw(4),
            cdw15: cdw(5),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::super::opcode::{admin, nvm};
    use super::super::sgl::tests::sgl;
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn offsets_match_spdk_struct_spdk_nvme_cmd() {
        // SPDK_STATIC_ASSERT(sizeof(struct spdk_nvme_cmd) == 64); offsetof: cid 2, nsid 4,
        // cdw2 8, cdw3 12, mptr 16, dptr 24, cdw10 40, cdw11 44, cdw12 48, cdw13 52, cdw14 56,
        // cdw15 60; opc:8 fuse:2 rsvd1:4 psdt:2 in the first halfword.
        let s = Sqe {
            opcode: nvm::READ,
            fuse: Fuse::Second,
            psdt: Psdt::SglMptrSgl,
            cid: 0x0302,
            nsid: 0x0706_0504,
            cdw2: 0x0b0a_0908,
            cdw3: 0x0f0e_0d0c,
            mptr: 0x1716_1514_1312_1110,
            dptr: DataPointer::Prp { prp1: 0x1f1e_1d1c_1b1a_1918, prp2: 0x2726_2524_2322_2120 },
            cdw10: 0x2b2a_2928,
            cdw11: 0x2f2e_2d2c,
            cdw12: 0x3332_3130,
            cdw13: 0x3736_3534,
            cdw14: 0x3b3a_3938,
            cdw15: 0x3f3e_3d3c,
        };
        let mut b = s.to_bytes();
        assert_eq!(b[0], 0x02);
        assert_eq!(b[1], 0x82); // fuse 10b in bits 1:0, psdt 10b in bits 7:6
        for (i, v) in b.iter().enumerate().skip(2) {
            if !(24..40).contains(&i) {
                assert_eq!(*v as usize, i, "byte {i}");
            }
        }
        // With PSDT 10b the data pointer is read back as an SGL descriptor.
        let sgl = SglDescriptor::decode(&b[24..40].try_into().unwrap());
        assert_eq!(Sqe::decode(&b), Sqe { dptr: DataPointer::Sgl(sgl), ..s });
        // With PSDT 00b, as PRP entries.
        b[1] = 0x02;
        assert_eq!(Sqe::decode(&b), Sqe { psdt: Psdt::Prp, ..s });
        // SPDK bitfields: fuse = 3 sets byte 1 bits 1:0, psdt = 3 sets bits 7:6.
        let f = Sqe { fuse: Fuse::Reserved, psdt: Psdt::Prp, ..Sqe::default() };
        assert_eq!(f.to_bytes()[1], 0x03);
        let p = Sqe { psdt: Psdt::Reserved, ..Sqe::default() };
        assert_eq!(p.to_bytes()[1], 0xc0);
    }

    #[test]
    fn new_uses_sgl() {
        let s = Sqe::new(admin::KEEP_ALIVE, 9, 0);
        let b = s.to_bytes();
        assert_eq!((b[0], b[1], b[2]), (0x18, 0x40, 9));
        assert_eq!(Sqe::decode(&b), s);
        assert_eq!(s.sgl(), Some(SglDescriptor::default()));
    }

    pub(crate) fn sqe() -> impl Strategy<Value = Sqe> {
        let head = (any::<u8>(), 0u8..4, 0u8..4, any::<u16>(), any::<u32>());
        let mid = (any::<u32>(), any::<u32>(), any::<u64>(), any::<(u64, u64)>(), sgl());
        (head, mid, any::<[u32; 6]>()).prop_map(
            |((opcode, fuse, psdt, cid, nsid), (cdw2, cdw3, mptr, (prp1, prp2), sgl), c)| {
                let psdt = Psdt::from_bits(psdt);
                let dptr = match psdt {
                    Psdt::Prp => DataPointer::Prp { prp1, prp2 },
                    _ => DataPointer::Sgl(sgl),
                };
                Sqe {
                    opcode,
                    fuse: Fuse::from_bits(fuse),
                    psdt,
                    cid,
                    nsid,
                    cdw2,
                    cdw3,
                    mptr,
                    dptr,
                    cdw10: c[0],
                    cdw11: c[1],
                    cdw12: c[2],
                    cdw13: c[3],
                    cdw14: c[4],
                    cdw15: c[5],
                }
            },
        )
    }

    proptest! {
        #[test]
        fn round_trip(s in sqe()) {
            prop_assert_eq!(Sqe::decode(&s.to_bytes()), s);
        }

        #[test]
        fn decode_any(b in proptest::array::uniform::<_, 64>(any::<u8>())) {
            let s = Sqe::decode(&b);
            prop_assert_eq!(Sqe::decode(&s.to_bytes()), s);
        }
    }
}
