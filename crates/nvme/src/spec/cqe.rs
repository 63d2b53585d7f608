//! The 16-byte completion queue entry (NVMe Base Specification 2.0, section 4.6 "Completion Queue
//! Entry", figure 89; SPDK `struct spdk_nvme_cpl`). Over fabrics it is the response capsule.

use super::le::{put_u16, put_u32, u16_at, u32_at};
use super::status::Status;

/// A completion queue entry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Cqe {
    /// Dword 0, command specific (bytes 3:0): for example the Connect response, the Number of
    /// Queues feature's answer, or the Asynchronous Event Request's event.
    pub dw0: u32,
    /// Dword 1, command specific (bytes 7:4): the upper half of a Property Get value.
    pub dw1: u32,
    /// SQ Head Pointer (SQHD, bytes 9:8).
    pub sqhd: u16,
    /// SQ Identifier (SQID, bytes 11:10).
    pub sqid: u16,
    /// Command Identifier (CID, bytes 13:12) of the completed command.
    pub cid: u16,
    /// Phase Tag (P, bit 0 of bytes 15:14).
    pub phase: bool,
    /// Status Field (bits 15:1 of bytes 15:14).
    pub status: Status,
}

impl Cqe {
    /// Size in bytes.
    pub const SIZE: usize = 16;
    /// Byte offset of dword 0.
    pub const OFFSET_DW0: usize = 0;
    /// Byte offset of dword 1.
    pub const OFFSET_DW1: usize = 4;
    /// Byte offset of SQHD.
    pub const OFFSET_SQHD: usize = 8;
    /// Byte offset of SQID.
    pub const OFFSET_SQID: usize = 10;
    /// Byte offset of CID.
    pub const OFFSET_CID: usize = 12;
    /// Byte offset of the status field (with the phase tag).
    pub const OFFSET_STATUS: usize = 14;

    /// A completion of command `cid` with `status` and every other field zero.
    pub const fn new(cid: u16, status: Status) -> Cqe {
        Cqe { dw0: 0, dw1: 0, sqhd: 0, sqid: 0, cid, phase: false, status }
    }

    /// Dwords 0 and 1 as one 64-bit value (the Property Get response's VALUE).
    pub const fn result_u64(&self) -> u64 {
        self.dw0 as u64 | (self.dw1 as u64) << 32
    }

    /// Sets dwords 0 and 1 from a 64-bit value.
    pub fn set_result_u64(&mut self, v: u64) {
        self.dw0 = v as u32;
        self.dw1 = (v >> 32) as u32;
    }

    /// Writes the entry.
    pub fn encode(&self, out: &mut [u8; Self::SIZE]) {
        put_u32(out, Self::OFFSET_DW0, self.dw0);
        put_u32(out, Self::OFFSET_DW1, self.dw1);
        put_u16(out, Self::OFFSET_SQHD, self.sqhd);
        put_u16(out, Self::OFFSET_SQID, self.sqid);
        put_u16(out, Self::OFFSET_CID, self.cid);
        put_u16(out, Self::OFFSET_STATUS, self.status.to_field(self.phase));
    }

    /// The entry's bytes.
    pub fn to_bytes(&self) -> [u8; Self::SIZE] {
        let mut b = [0; Self::SIZE];
        self.encode(&mut b);
        b
    }

    /// Reads an entry; every byte pattern is a valid entry.
    pub fn decode(b: &[u8; Self::SIZE]) -> Cqe {
        let (status, phase) = Status::from_field(u16_at(b, Self::OFFSET_STATUS));
        Cqe {
            dw0: u32_at(b, Self::OFFSET_DW0),
            dw1: u32_at(b, Self::OFFSET_DW1),
            sqhd: u16_at(b, Self::OFFSET_SQHD),
            sqid: u16_at(b, Self::OFFSET_SQID),
            cid: u16_at(b, Self::OFFSET_CID),
            phase,
            status,
        }
    }

    /// Reads an entry from the first 16 bytes of `b`, if it has that many.
    pub fn decode_prefix(b: &[u8]) -> Option<Cqe> {
        b.first_chunk::<{ Self::SIZE }>().map(Cqe::decode)
    }
}

impl From<&[u8; Cqe::SIZE]> for Cqe {
    fn from(b: &[u8; Cqe::SIZE]) -> Cqe {
        Cqe::decode(b)
    }
}

impl From<Cqe> for [u8; Cqe::SIZE] {
    fn from(c: Cqe) -> [u8; Cqe::SIZE] {
        c.to_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::super::status::{fabrics, generic, sct};
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn offsets_match_spdk_struct_spdk_nvme_cpl() {
        // SPDK_STATIC_ASSERT(sizeof(struct spdk_nvme_cpl) == 16); offsetof: cdw0 0, cdw1 4,
        // sqhd 8, sqid 10, cid 12, status 14.
        let c = Cqe {
            dw0: 0x0403_0201,
            dw1: 0x0807_0605,
            sqhd: 0x0a09,
            sqid: 0x0c0b,
            cid: 0x0e0d,
            phase: true,
            status: Status::command_specific(fabrics::CONNECT_INVALID_PARAMETERS).with_dnr(),
        };
        let b = c.to_bytes();
        assert_eq!(&b[0..14], &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]);
        // p=1, sc=0x82 (bits 8:1), sct=1 (bits 11:9), dnr (bit 15).
        assert_eq!(u16::from_le_bytes([b[14], b[15]]), 0x8000 | 1 << 9 | 0x82 << 1 | 1);
        assert_eq!(Cqe::decode(&b), c);
        assert_eq!(Cqe::decode(&b).status.sct, sct::COMMAND_SPECIFIC);
    }

    #[test]
    fn result_u64() {
        let mut c = Cqe::new(7, Status::generic(generic::SUCCESS));
        c.set_result_u64(0x1122_3344_5566_7788);
        assert_eq!((c.dw0, c.dw1), (0x5566_7788, 0x1122_3344));
        assert_eq!(c.result_u64(), 0x1122_3344_5566_7788);
        assert_eq!(Cqe::decode_prefix(&[0; 15]), None);
        assert_eq!(Cqe::decode_prefix(&c.to_bytes()), Some(c));
    }

    pub(crate) fn cqe() -> impl Strategy<Value = Cqe> {
        (any::<(u32, u32, u16, u16, u16, bool)>(), any::<u16>()).prop_map(|((dw0, dw1, sqhd, sqid, cid, _), field)| {
            let (status, phase) = Status::from_field(field);
            Cqe { dw0, dw1, sqhd, sqid, cid, phase, status }
        })
    }

    proptest! {
        #[test]
        fn round_trip(c in cqe()) {
            prop_assert_eq!(Cqe::decode(&c.to_bytes()), c);
        }

        #[test]
        fn decode_any(b in any::<[u8; 16]>()) {
            // Every bit of a completion is a field: bytes survive decode and encode.
            prop_assert_eq!(Cqe::decode(&b).to_bytes(), b);
        }
    }
}
