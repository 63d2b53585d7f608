//! Identify Namespace data for the NVM command set (CNS 00h, 4096 bytes; NVM Command Set
//! Specification 1.0 figure 97 "Identify Namespace Data Structure"; SPDK `struct
//! spdk_nvme_ns_data`, Linux `struct nvme_id_ns`).

use super::le::{arr, put, put_u128, put_u16, put_u32, put_u64, u128_at, u16_at, u32_at, u64_at};

/// LBA Format (NVM Command Set 1.0 figure 98; SPDK `struct spdk_nvme_ns_data_lbaf`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LbaFormat {
    /// Metadata Size (MS, bits 15:0), bytes per block.
    pub ms: u16,
    /// LBA Data Size (LBADS, bits 23:16): 2 ^ LBADS bytes (9 for 512, 12 for 4096); 0 means
    /// the format is not supported.
    pub lbads: u8,
    /// Relative Performance (RP, bits 25:24): 0 best to 3 degraded. Two bits.
    pub rp: u8,
}

impl LbaFormat {
    /// A format of `2 ^ lbads`-byte blocks without metadata.
    pub const fn new(lbads: u8) -> LbaFormat {
        LbaFormat { ms: 0, lbads, rp: 0 }
    }

    /// The format's dword.
    pub const fn to_u32(&self) -> u32 {
        self.ms as u32 | (self.lbads as u32) << 16 | ((self.rp & 3) as u32) << 24
    }

    /// The fields of a format dword.
    pub const fn from_u32(v: u32) -> LbaFormat {
        LbaFormat { ms: v as u16, lbads: (v >> 16) as u8, rp: ((v >> 24) & 3) as u8 }
    }

    /// Block size in bytes, if LBADS is a usable exponent (9 to 31).
    pub const fn block_size(&self) -> Option<u32> {
        if self.lbads >= 9 && self.lbads < 32 {
            Some(1 << self.lbads)
        } else {
            None
        }
    }
}

/// NSFEAT bits (Namespace Features, byte 24).
pub mod nsfeat {
    /// Thin provisioning (NCAP may be smaller than NSZE).
    pub const THIN_PROVISIONING: u8 = 1 << 0;
    /// NAWUN, NAWUPF and NACWU are defined for this namespace.
    pub const NS_ATOMICS: u8 = 1 << 1;
    /// Deallocated or Unwritten Logical Block error supported.
    pub const DEALLOC_ERROR: u8 = 1 << 2;
    /// NGUID and EUI64 are never reused.
    pub const UID_REUSE: u8 = 1 << 3;
    /// NPWG, NPWA, NPDG, NPDA and NOWS are defined (Linux `NVME_NS_FEAT_IO_OPT`).
    pub const OPTPERF: u8 = 1 << 4;
}

/// FLBAS fields (Formatted LBA Size, byte 26).
pub mod flbas {
    /// Low four bits of the format index.
    pub const INDEX_LOW_MASK: u8 = 0x0f;
    /// Metadata at the end of each block (extended LBA); fabrics hosts require it with metadata.
    pub const EXTENDED: u8 = 1 << 4;
    /// High two bits of the format index (bits 6:5), used when NLBAF > 16.
    pub const INDEX_HIGH_MASK: u8 = 0x60;

    /// The LBA format index FLBAS selects.
    pub const fn index(flbas: u8) -> usize {
        ((flbas & INDEX_LOW_MASK) | (flbas & INDEX_HIGH_MASK) >> 1) as usize
    }

    /// The FLBAS byte selecting format `index` (0-63), with or without extended metadata.
    pub const fn new(index: usize, extended: bool) -> u8 {
        let i = (index & 0x3f) as u8;
        (i & INDEX_LOW_MASK) | (i & 0x30) << 1 | if extended { EXTENDED } else { 0 }
    }
}

/// DPS fields (End-to-end Data Protection Type Settings, byte 29).
pub mod dps {
    /// Protection Information Type (bits 2:0): 0 none, 1-3 types 1-3.
    pub const PI_TYPE_MASK: u8 = 0x7;
    /// Protection information is in the first bytes of metadata.
    pub const PI_FIRST: u8 = 1 << 3;
}

/// DPC bits (End-to-end Data Protection Capabilities, byte 28).
pub mod dpc {
    /// Type 1 supported.
    pub const TYPE1: u8 = 1 << 0;
    /// Type 2 supported.
    pub const TYPE2: u8 = 1 << 1;
    /// Type 3 supported.
    pub const TYPE3: u8 = 1 << 2;
    /// Protection information in the first bytes of metadata supported.
    pub const PI_FIRST: u8 = 1 << 3;
    /// Protection information in the last bytes of metadata supported.
    pub const PI_LAST: u8 = 1 << 4;
}

/// MC bits (Metadata Capabilities, byte 27).
pub mod mc {
    /// Metadata as part of an extended data LBA.
    pub const EXTENDED: u8 = 1 << 0;
    /// Metadata in a separate buffer.
    pub const POINTER: u8 = 1 << 1;
}

/// NMIC bits (Namespace Multi-path I/O and Namespace Sharing Capabilities, byte 30).
pub mod nmic {
    /// The namespace may be attached to two or more controllers.
    pub const SHARED: u8 = 1 << 0;
}

/// RESCAP bits (Reservation Capabilities, byte 31).
pub mod rescap {
    /// Persist Through Power Loss.
    pub const PTPL: u8 = 1 << 0;
    /// Write Exclusive.
    pub const WRITE_EXCLUSIVE: u8 = 1 << 1;
    /// Exclusive Access.
    pub const EXCLUSIVE_ACCESS: u8 = 1 << 2;
    /// Write Exclusive – Registrants Only.
    pub const WRITE_EXCLUSIVE_REG_ONLY: u8 = 1 << 3;
    /// Exclusive Access – Registrants Only.
    pub const EXCLUSIVE_ACCESS_REG_ONLY: u8 = 1 << 4;
    /// Write Exclusive – All Registrants.
    pub const WRITE_EXCLUSIVE_ALL_REGS: u8 = 1 << 5;
    /// Exclusive Access – All Registrants.
    pub const EXCLUSIVE_ACCESS_ALL_REGS: u8 = 1 << 6;
    /// Ignore Existing Key behaves as in NVMe 1.3 and later.
    pub const IGNORE_EXISTING_KEY: u8 = 1 << 7;
}

/// DLFEAT fields (Deallocate Logical Block Features, byte 33).
pub mod dlfeat {
    /// Read value of deallocated blocks (bits 2:0) mask.
    pub const READ_VALUE_MASK: u8 = 0x7;
    /// Deallocated blocks read as zeroes (read value 001b).
    pub const READ_ZEROES: u8 = 0x1;
    /// Deallocated blocks read as FFh (read value 010b).
    pub const READ_ONES: u8 = 0x2;
    /// Write Zeroes' Deallocate bit is supported. Linux sets DEAC only with this and
    /// [`READ_ZEROES`].
    pub const WRITE_ZEROES_DEALLOCATE: u8 = 1 << 3;
    /// The guard of deallocated blocks is the CRC of the read value.
    pub const GUARD_CRC: u8 = 1 << 4;
}

/// NSATTR bits (Namespace Attributes, byte 99).
pub mod nsattr {
    /// The namespace is currently write protected.
    pub const WRITE_PROTECTED: u8 = 1 << 0;
}

/// Identify Namespace data (NVM command set). Byte offsets are in each field's doc and in the
/// unit tests; the bytes it does not name are written as zero.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IdentifyNamespace {
    /// Namespace Size (NSZE, bytes 7:0), blocks.
    pub nsze: u64,
    /// Namespace Capacity (NCAP, bytes 15:8), blocks; 0 means not allocated (Linux removes the
    /// namespace).
    pub ncap: u64,
    /// Namespace Utilization (NUSE, bytes 23:16), blocks.
    pub nuse: u64,
    /// Namespace Features (NSFEAT, byte 24); [`nsfeat`].
    pub nsfeat: u8,
    /// Number of LBA Formats (NLBAF, byte 25), 0-based.
    pub nlbaf: u8,
    /// Formatted LBA Size (FLBAS, byte 26); [`flbas`].
    pub flbas: u8,
    /// Metadata Capabilities (MC, byte 27); [`mc`].
    pub mc: u8,
    /// End-to-end Data Protection Capabilities (DPC, byte 28); [`dpc`].
    pub dpc: u8,
    /// End-to-end Data Protection Type Settings (DPS, byte 29); [`dps`].
    pub dps: u8,
    /// Namespace Multi-path I/O and Namespace Sharing Capabilities (NMIC, byte 30); [`nmic`].
    pub nmic: u8,
    /// Reservation Capabilities (RESCAP, byte 31); [`rescap`].
    pub rescap: u8,
    /// Format Progress Indicator (FPI, byte 32).
    pub fpi: u8,
    /// Deallocate Logical Block Features (DLFEAT, byte 33); [`dlfeat`].
    pub dlfeat: u8,
    /// Namespace Atomic Write Unit Normal (NAWUN, bytes 35:34), 0-based blocks.
    pub nawun: u16,
    /// Namespace Atomic Write Unit Power Fail (NAWUPF, bytes 37:36), 0-based blocks.
    pub nawupf: u16,
    /// Namespace Atomic Compare & Write Unit (NACWU, bytes 39:38), 0-based blocks.
    pub nacwu: u16,
    /// Namespace Atomic Boundary Size Normal (NABSN, bytes 41:40).
    pub nabsn: u16,
    /// Namespace Atomic Boundary Offset (NABO, bytes 43:42).
    pub nabo: u16,
    /// Namespace Atomic Boundary Size Power Fail (NABSPF, bytes 45:44).
    pub nabspf: u16,
    /// Namespace Optimal I/O Boundary (NOIOB, bytes 47:46), blocks.
    pub noiob: u16,
    /// NVM Capacity (NVMCAP, bytes 63:48), bytes.
    pub nvmcap: u128,
    /// Namespace Preferred Write Granularity (NPWG, bytes 65:64), 0-based blocks.
    pub npwg: u16,
    /// Namespace Preferred Write Alignment (NPWA, bytes 67:66), 0-based blocks.
    pub npwa: u16,
    /// Namespace Preferred Deallocate Granularity (NPDG, bytes 69:68), 0-based blocks.
    pub npdg: u16,
    /// Namespace Preferred Deallocate Alignment (NPDA, bytes 71:70), 0-based blocks.
    pub npda: u16,
    /// Namespace Optimal Write Size (NOWS, bytes 73:72), 0-based blocks.
    pub nows: u16,
    /// Maximum Single Source Range Length (MSSRL, bytes 75:74), for Copy.
    pub mssrl: u16,
    /// Maximum Copy Length (MCL, bytes 79:76).
    pub mcl: u32,
    /// Maximum Source Range Count (MSRC, byte 80), 0-based.
    pub msrc: u8,
    /// ANA Group Identifier (ANAGRPID, bytes 95:92).
    pub anagrpid: u32,
    /// Namespace Attributes (NSATTR, byte 99); [`nsattr`].
    pub nsattr: u8,
    /// NVM Set Identifier (NVMSETID, bytes 101:100).
    pub nvmsetid: u16,
    /// Endurance Group Identifier (ENDGID, bytes 103:102).
    pub endgid: u16,
    /// Namespace Globally Unique Identifier (NGUID, bytes 119:104), big-endian as assigned.
    pub nguid: [u8; 16],
    /// IEEE Extended Unique Identifier (EUI64, bytes 127:120), a byte string (SPDK declares it
    /// `uint64_t` but copies bytes).
    pub eui64: [u8; 8],
    /// LBA Formats 0-63 (bytes 383:128); NLBAF says how many are valid.
    pub lbaf: [LbaFormat; 64],
}

impl Default for IdentifyNamespace {
    fn default() -> Self {
        IdentifyNamespace {
            nsze: 0,
            ncap: 0,
            nuse: 0,
            nsfeat: 0,
            nlbaf: 0,
            flbas: 0,
            mc: 0,
            dpc: 0,
            dps: 0,
            nmic: 0,
            rescap: 0,
            fpi: 0,
            dlfeat: 0,
            nawun: 0,
            nawupf: 0,
            nacwu: 0,
            nabsn: 0,
            nabo: 0,
            nabspf: 0,
            noiob: 0,
            nvmcap: 0,
            npwg: 0,
            npwa: 0,
            npdg: 0,
            npda: 0,
            nows: 0,
            mssrl: 0,
            mcl: 0,
            msrc: 0,
            anagrpid: 0,
            nsattr: 0,
            nvmsetid: 0,
            endgid: 0,
            nguid: [0; 16],
            eui64: [0; 8],
            lbaf: [LbaFormat::default(); 64],
        }
    }
}

impl IdentifyNamespace {
    /// Size in bytes.
    pub const SIZE: usize = 4096;
    /// Byte offset of LBA format 0.
    pub const OFFSET_LBAF: usize = 128;

    /// The LBA format FLBAS selects.
    pub fn current_format(&self) -> LbaFormat {
        self.lbaf[flbas::index(self.flbas)]
    }

    /// Writes the data; bytes without a field here are zero.
    pub fn encode(&self, out: &mut [u8; Self::SIZE]) {
        out.fill(0);
        put_u64(out, 0, self.nsze);
        put_u64(out, 8, self.ncap);
        put_u64(out, 16, self.nuse);
        out[24..34].copy_from_slice(&[
            self.nsfeat,
            self.nlbaf,
            self.flbas,
            self.mc,
            self.dpc,
            self.dps,
            self.nmic,
            self.rescap,
            self.fpi,
            self.dlfeat,
        ]);
        put_u16(out, 34, self.nawun);
        put_u16(out, 36, self.nawupf);
        put_u16(out, 38, self.nacwu);
        put_u16(out, 40, self.nabsn);
        put_u16(out, 42, self.nabo);
        put_u16(out, 44, self.nabspf);
        put_u16(out, 46, self.noiob);
        put_u128(out, 48, self.nvmcap);
        put_u16(out, 64, self.npwg);
        put_u16(out, 66, self.npwa);
        put_u16(out, 68, self.npdg);
        put_u16(out, 70, self.npda);
        put_u16(out, 72, self.nows);
        put_u16(out, 74, self.mssrl);
        put_u32(out, 76, self.mcl);
        out[80] = self.msrc;
        put_u32(out, 92, self.anagrpid);
        out[99] = self.nsattr;
        put_u16(out, 100, self.nvmsetid);
        put_u16(out, 102, self.endgid);
        put(out, 104, &self.nguid);
        put(out, 120, &self.eui64);
        for (i, f) in self.lbaf.iter().enumerate() {
            put_u32(out, Self::OFFSET_LBAF + 4 * i, f.to_u32());
        }
    }

    /// The data's bytes.
    pub fn to_bytes(&self) -> [u8; Self::SIZE] {
        let mut b = [0; Self::SIZE];
        self.encode(&mut b);
        b
    }

    /// Reads the data; every byte pattern is accepted.
    pub fn decode(b: &[u8; Self::SIZE]) -> IdentifyNamespace {
        let mut lbaf = [LbaFormat::default(); 64];
        for (i, f) in lbaf.iter_mut().enumerate() {
            *f = LbaFormat::from_u32(u32_at(b, Self::OFFSET_LBAF + 4 * i));
        }
        IdentifyNamespace {
            nsze: u64_at(b, 0),
            ncap: u64_at(b, 8),
            nuse: u64_at(b, 16),
            nsfeat: b[24],
            nlbaf: b[25],
            flbas: b[26],
            mc: b[27],
            dpc: b[28],
            dps: b[29],
            nmic: b[30],
            rescap: b[31],
            fpi: b[32],
            dlfeat: b[33],
            nawun: u16_at(b, 34),
            nawupf: u16_at(b, 36),
            nacwu: u16_at(b, 38),
            nabsn: u16_at(b, 40),
            nabo: u16_at(b, 42),
            nabspf: u16_at(b, 44),
            noiob: u16_at(b, 46),
            nvmcap: u128_at(b, 48),
            npwg: u16_at(b, 64),
            npwa: u16_at(b, 66),
            npdg: u16_at(b, 68),
            npda: u16_at(b, 70),
            nows: u16_at(b, 72),
            mssrl: u16_at(b, 74),
            mcl: u32_at(b, 76),
            msrc: b[80],
            anagrpid: u32_at(b, 92),
            nsattr: b[99],
            nvmsetid: u16_at(b, 100),
            endgid: u16_at(b, 102),
            nguid: arr(b, 104),
            eui64: arr(b, 120),
            lbaf,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn offsets_match_spdk_struct_spdk_nvme_ns_data() {
        // SPDK_STATIC_ASSERT(sizeof(struct spdk_nvme_ns_data) == 4096) and
        // sizeof(struct spdk_nvme_ns_data_head) == 128; offsets from offsetof().
        let mut n = IdentifyNamespace {
            nsze: 0x0807_0605_0403_0201,
            ncap: 8,
            nuse: 16,
            nsfeat: nsfeat::THIN_PROVISIONING | nsfeat::OPTPERF,
            nlbaf: 1,
            flbas: flbas::new(1, false),
            mc: 27,
            dpc: 28,
            dps: 29,
            nmic: nmic::SHARED,
            rescap: 31,
            fpi: 32,
            dlfeat: dlfeat::READ_ZEROES | dlfeat::WRITE_ZEROES_DEALLOCATE,
            nawun: 34,
            nawupf: 36,
            nacwu: 38,
            nabsn: 40,
            nabo: 42,
            nabspf: 44,
            noiob: 46,
            nvmcap: 48,
            npwg: 64,
            npwa: 66,
            npdg: 68,
            npda: 70,
            nows: 72,
            mssrl: 74,
            mcl: 76,
            msrc: 80,
            anagrpid: 92,
            nsattr: 1,
            nvmsetid: 100,
            endgid: 102,
            nguid: [104; 16],
            eui64: [120; 8],
            ..Default::default()
        };
        n.lbaf[0] = LbaFormat::new(9);
        n.lbaf[1] = LbaFormat { ms: 8, lbads: 12, rp: 2 };
        n.lbaf[63] = LbaFormat::new(12);
        let b = n.to_bytes();
        let u16at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
        let u32at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        assert_eq!(&b[0..8], &[1, 2, 3, 4, 5, 6, 7, 8]); // nsze
        assert_eq!((b[8], b[16]), (8, 16)); // ncap, nuse
        assert_eq!(&b[24..34], &[0x11, 1, 1, 27, 28, 29, 1, 31, 32, 0x09]); // nsfeat..dlfeat
        for o in (34..48).step_by(2) {
            assert_eq!(u16at(o) as usize, o); // nawun..noiob
        }
        assert_eq!(b[48], 48); // nvmcap
        for o in (64..76).step_by(2) {
            assert_eq!(u16at(o) as usize, o); // npwg..mssrl
        }
        assert_eq!((u32at(76), b[80]), (76, 80)); // mcl, msrc
        assert_eq!(u32at(92), 92); // anagrpid
        assert_eq!((b[99], u16at(100), u16at(102)), (1, 100, 102)); // nsattr, nvmsetid, endgid
        assert_eq!(&b[104..120], &[104; 16]); // nguid
        assert_eq!(&b[120..128], &[120; 8]); // eui64
                                             // lbaf[0] at 128: ms 15:0, lbads 23:16, rp 25:24.
        assert_eq!(u32at(128), 0x0009_0000);
        assert_eq!(u32at(132), 0x020c_0008);
        assert_eq!(u32at(128 + 4 * 63), 0x000c_0000);
        assert!(b[81..92].iter().all(|&x| x == 0));
        assert!(b[384..].iter().all(|&x| x == 0));
        assert_eq!(IdentifyNamespace::decode(&b), n);
        assert_eq!(n.current_format().block_size(), Some(4096));
    }

    #[test]
    fn flbas_index_uses_bits_6_5_for_formats_above_15() {
        // Linux nvme_lbaf_index: (flbas & 0xf) | ((flbas & 0x60) >> 1).
        assert_eq!(flbas::index(0x0f), 15);
        assert_eq!(flbas::index(0x20), 16);
        assert_eq!(flbas::index(0x7f), 63);
        assert_eq!(flbas::index(0x10), 0);
        assert_eq!(flbas::new(63, true), 0x7f);
        assert_eq!(flbas::new(16, false), 0x20);
        for i in 0..64 {
            assert_eq!(flbas::index(flbas::new(i, i % 2 == 0)), i);
        }
        assert_eq!(LbaFormat::new(0).block_size(), None);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn decode_any(b in proptest::array::uniform::<_, 4096>(any::<u8>())) {
            let n = IdentifyNamespace::decode(&b);
            prop_assert_eq!(IdentifyNamespace::decode(&n.to_bytes()), n);
            let _ = n.current_format().block_size();
        }

        #[test]
        fn lbaf_round_trip(v in any::<u32>()) {
            prop_assert_eq!(LbaFormat::from_u32(v).to_u32(), v & 0x03ff_ffff);
        }
    }
}
