//! Scatter gather list descriptors (NVMe Base Specification 2.0, section 4.1.2 "Scatter Gather
//! List (SGL)", figures 87-88 and the descriptor figures after them; SPDK
//! `struct spdk_nvme_sgl_descriptor`). Fabrics commands carry their data pointer as one such
//! 16-byte descriptor in SQE bytes 39:24 (NVMe over Fabrics 1.1 section 2.3.1).
//!
//! Layout: bytes 7:0 address, then either an unkeyed length (bytes 11:8, bytes 14:12 reserved)
//! or a keyed one (bytes 10:8 length, bytes 14:11 key), and byte 15 the SGL identifier: the
//! descriptor type in bits 7:4 and the subtype in bits 3:0.

use super::le::{put_u32, put_u64, u32_at, u64_at};

/// Descriptor type values (bits 7:4 of the SGL identifier; NVMe 2.0 figure 88).
pub mod sgl_type {
    /// SGL Data Block.
    pub const DATA_BLOCK: u8 = 0x0;
    /// SGL Bit Bucket.
    pub const BIT_BUCKET: u8 = 0x1;
    /// SGL Segment.
    pub const SEGMENT: u8 = 0x2;
    /// SGL Last Segment.
    pub const LAST_SEGMENT: u8 = 0x3;
    /// Keyed SGL Data Block (RDMA).
    pub const KEYED_DATA_BLOCK: u8 = 0x4;
    /// Transport SGL Data Block (NVMe/TCP data carried by H2C/C2H PDUs).
    pub const TRANSPORT_DATA_BLOCK: u8 = 0x5;
    /// Vendor Specific (6h-Eh are reserved).
    pub const VENDOR_SPECIFIC: u8 = 0xf;
}

/// Descriptor subtype values (bits 3:0 of the SGL identifier; NVMe 2.0 figure 88).
pub mod sgl_subtype {
    /// Address: the address field is a memory address.
    pub const ADDRESS: u8 = 0x0;
    /// Offset: the address field is an offset into the command capsule's data (in-capsule
    /// data, NVMe over Fabrics 1.1 section 2.3.1).
    pub const OFFSET: u8 = 0x1;
    /// Transport specific format Ah: what NVMe/TCP uses with the Transport SGL Data Block.
    pub const TRANSPORT: u8 = 0xa;
    /// Invalidate Key: RDMA's Keyed SGL Data Block subtype asking for remote invalidation
    /// (SPDK `SPDK_NVME_SGL_SUBTYPE_INVALIDATE_KEY`, Linux `NVME_SGL_FMT_INVALIDATE`).
    pub const INVALIDATE_KEY: u8 = 0xf;
}

/// What a receiver checks of a descriptor on every command, read straight from its 16 bytes
/// without building a [`SglDescriptor`]: the type, the subtype, the address and the unkeyed
/// length (bytes 11:8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SglFields {
    /// Descriptor type (bits 7:4 of the identifier); see [`sgl_type`].
    pub sgl_type: u8,
    /// Descriptor subtype (bits 3:0 of the identifier); see [`sgl_subtype`].
    pub subtype: u8,
    /// Bytes 7:0.
    pub address: u64,
    /// Bytes 11:8 (the length of every unkeyed type).
    pub length: u32,
}

impl SglFields {
    /// Reads the fields of the descriptor in `b` (16 bytes).
    pub fn read(b: &[u8; SglDescriptor::SIZE]) -> SglFields {
        let id = b[SglDescriptor::OFFSET_IDENTIFIER];
        SglFields {
            sgl_type: id >> 4,
            subtype: id & 0xf,
            address: u64_at(b, SglDescriptor::OFFSET_ADDRESS),
            length: u32_at(b, SglDescriptor::OFFSET_LENGTH),
        }
    }
}

/// One SGL descriptor. Every variant keeps the bytes its type defines; reserved bytes are
/// written as zero and ignored when read. `subtype` is four bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SglDescriptor {
    /// SGL Data Block (type 0): `length` bytes at `address`, or at offset `address` into the
    /// capsule's in-capsule data when `subtype` is [`sgl_subtype::OFFSET`].
    DataBlock {
        /// Address or in-capsule offset (bytes 7:0).
        address: u64,
        /// Length in bytes (bytes 11:8).
        length: u32,
        /// Descriptor subtype.
        subtype: u8,
    },
    /// SGL Bit Bucket (type 1): `length` bytes of read data the host discards. The address
    /// field is reserved; it is kept as read.
    BitBucket {
        /// Address field (bytes 7:0, reserved for this type).
        address: u64,
        /// Length in bytes (bytes 11:8).
        length: u32,
        /// Descriptor subtype.
        subtype: u8,
    },
    /// SGL Segment (type 2): the next segment of descriptors, `length` bytes at `address`.
    Segment {
        /// Address or offset of the segment (bytes 7:0).
        address: u64,
        /// Length of the segment in bytes (bytes 11:8).
        length: u32,
        /// Descriptor subtype.
        subtype: u8,
    },
    /// SGL Last Segment (type 3): the last segment of descriptors.
    LastSegment {
        /// Address or offset of the segment (bytes 7:0).
        address: u64,
        /// Length of the segment in bytes (bytes 11:8).
        length: u32,
        /// Descriptor subtype.
        subtype: u8,
    },
    /// Keyed SGL Data Block (type 4): remote memory named by `key` (RDMA).
    KeyedDataBlock {
        /// Remote address (bytes 7:0).
        address: u64,
        /// Length in bytes (bytes 10:8, 24 bits).
        length: u32,
        /// Key (bytes 14:11).
        key: u32,
        /// Descriptor subtype.
        subtype: u8,
    },
    /// Transport SGL Data Block (type 5): data the transport moves itself (NVMe/TCP: R2T and
    /// H2CData, or C2HData). NVMe/TCP hosts send address 0 and subtype
    /// [`sgl_subtype::TRANSPORT`].
    TransportDataBlock {
        /// Address field (bytes 7:0).
        address: u64,
        /// Length in bytes (bytes 11:8).
        length: u32,
        /// Descriptor subtype.
        subtype: u8,
    },
    /// A reserved (6h-Eh) or vendor specific (Fh) type, kept byte for byte.
    Other([u8; 16]),
}

impl Default for SglDescriptor {
    fn default() -> Self {
        SglDescriptor::DataBlock { address: 0, length: 0, subtype: sgl_subtype::ADDRESS }
    }
}

impl SglDescriptor {
    /// Size in bytes.
    pub const SIZE: usize = 16;
    /// Byte offset of the address field.
    pub const OFFSET_ADDRESS: usize = 0;
    /// Byte offset of the (unkeyed or keyed) length field.
    pub const OFFSET_LENGTH: usize = 8;
    /// Byte offset of a keyed descriptor's key.
    pub const OFFSET_KEY: usize = 11;
    /// Byte offset of the SGL identifier (type and subtype).
    pub const OFFSET_IDENTIFIER: usize = 15;
    /// Largest length a keyed descriptor holds (24 bits).
    pub const KEYED_LENGTH_MAX: u32 = 0x00ff_ffff;

    /// In-capsule data: `length` bytes at `offset` into the capsule's data (a Data Block with
    /// the Offset subtype; what an NVMe/TCP host sends for a write whose data fits in ICD).
    pub const fn in_capsule(offset: u64, length: u32) -> SglDescriptor {
        SglDescriptor::DataBlock { address: offset, length, subtype: sgl_subtype::OFFSET }
    }

    /// Transport data: `length` bytes moved by the transport (what an NVMe/TCP host sends for
    /// reads and for writes that need R2T).
    pub const fn transport(length: u32) -> SglDescriptor {
        SglDescriptor::TransportDataBlock { address: 0, length, subtype: sgl_subtype::TRANSPORT }
    }

    /// The descriptor type (bits 7:4 of the identifier).
    pub const fn sgl_type(&self) -> u8 {
        match self {
            SglDescriptor::DataBlock { .. } => sgl_type::DATA_BLOCK,
            SglDescriptor::BitBucket { .. } => sgl_type::BIT_BUCKET,
            SglDescriptor::Segment { .. } => sgl_type::SEGMENT,
            SglDescriptor::LastSegment { .. } => sgl_type::LAST_SEGMENT,
            SglDescriptor::KeyedDataBlock { .. } => sgl_type::KEYED_DATA_BLOCK,
            SglDescriptor::TransportDataBlock { .. } => sgl_type::TRANSPORT_DATA_BLOCK,
            SglDescriptor::Other(b) => b[Self::OFFSET_IDENTIFIER] >> 4,
        }
    }

    /// The descriptor subtype (bits 3:0 of the identifier).
    pub const fn subtype(&self) -> u8 {
        match self {
            SglDescriptor::DataBlock { subtype, .. }
            | SglDescriptor::BitBucket { subtype, .. }
            | SglDescriptor::Segment { subtype, .. }
            | SglDescriptor::LastSegment { subtype, .. }
            | SglDescriptor::KeyedDataBlock { subtype, .. }
            | SglDescriptor::TransportDataBlock { subtype, .. } => *subtype & 0xf,
            SglDescriptor::Other(b) => b[Self::OFFSET_IDENTIFIER] & 0xf,
        }
    }

    /// The length in bytes, for every type but [`SglDescriptor::Other`].
    pub const fn length(&self) -> Option<u32> {
        match self {
            SglDescriptor::DataBlock { length, .. }
            | SglDescriptor::BitBucket { length, .. }
            | SglDescriptor::Segment { length, .. }
            | SglDescriptor::LastSegment { length, .. }
            | SglDescriptor::TransportDataBlock { length, .. } => Some(*length),
            SglDescriptor::KeyedDataBlock { length, .. } => Some(*length & Self::KEYED_LENGTH_MAX),
            SglDescriptor::Other(_) => None,
        }
    }

    /// Writes the descriptor. A keyed length is truncated to 24 bits, a subtype to 4.
    pub fn encode(&self, out: &mut [u8; Self::SIZE]) {
        let ident = |t: u8, s: u8| (t << 4) | (s & 0xf);
        match *self {
            SglDescriptor::DataBlock { address, length, subtype }
            | SglDescriptor::BitBucket { address, length, subtype }
            | SglDescriptor::Segment { address, length, subtype }
            | SglDescriptor::LastSegment { address, length, subtype }
            | SglDescriptor::TransportDataBlock { address, length, subtype } => {
                out.fill(0);
                put_u64(out, Self::OFFSET_ADDRESS, address);
                put_u32(out, Self::OFFSET_LENGTH, length);
                out[Self::OFFSET_IDENTIFIER] = ident(self.sgl_type(), subtype);
            }
            SglDescriptor::KeyedDataBlock { address, length, key, subtype } => {
                put_u64(out, Self::OFFSET_ADDRESS, address);
                out[8..11].copy_from_slice(&length.to_le_bytes()[..3]);
                put_u32(out, Self::OFFSET_KEY, key);
                out[Self::OFFSET_IDENTIFIER] = ident(sgl_type::KEYED_DATA_BLOCK, subtype);
            }
            SglDescriptor::Other(b) => *out = b,
        }
    }

    /// The descriptor's bytes.
    pub fn to_bytes(&self) -> [u8; Self::SIZE] {
        let mut b = [0; Self::SIZE];
        self.encode(&mut b);
        b
    }

    /// Reads a descriptor; every byte pattern is a valid descriptor.
    pub fn decode(b: &[u8; Self::SIZE]) -> SglDescriptor {
        let address = u64_at(b, Self::OFFSET_ADDRESS);
        let length = u32_at(b, Self::OFFSET_LENGTH);
        let subtype = b[Self::OFFSET_IDENTIFIER] & 0xf;
        match b[Self::OFFSET_IDENTIFIER] >> 4 {
            sgl_type::DATA_BLOCK => SglDescriptor::DataBlock { address, length, subtype },
            sgl_type::BIT_BUCKET => SglDescriptor::BitBucket { address, length, subtype },
            sgl_type::SEGMENT => SglDescriptor::Segment { address, length, subtype },
            sgl_type::LAST_SEGMENT => SglDescriptor::LastSegment { address, length, subtype },
            sgl_type::KEYED_DATA_BLOCK => SglDescriptor::KeyedDataBlock {
                address,
                length: u32::from_le_bytes([b[8], b[9], b[10], 0]),
                key: u32_at(b, Self::OFFSET_KEY),
                subtype,
            },
            sgl_type::TRANSPORT_DATA_BLOCK => SglDescriptor::TransportDataBlock { address, length, subtype },
            _ => SglDescriptor::Other(*b),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn keyed_layout_matches_spdk_bitfields() {
        // SPDK keyed: uint64_t length:24, key:32, subtype:4, type:4 after the 8-byte address.
        let d =
            SglDescriptor::KeyedDataBlock { address: 0x0807_0605_0403_0201, length: 0x00ff_ffff, key: 0, subtype: 0 };
        let b = d.to_bytes();
        assert_eq!(b, [1, 2, 3, 4, 5, 6, 7, 8, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0x40]);
        let d = SglDescriptor::KeyedDataBlock { address: 0, length: 0, key: 0xffff_ffff, subtype: 0xf };
        assert_eq!(d.to_bytes(), [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x4f]);
    }

    #[test]
    fn fields_agree_with_the_descriptor() {
        for d in [
            SglDescriptor::DataBlock { address: 0, length: 4096, subtype: sgl_subtype::OFFSET },
            SglDescriptor::TransportDataBlock { address: 7, length: 1 << 20, subtype: sgl_subtype::TRANSPORT },
            SglDescriptor::BitBucket { address: u64::MAX, length: u32::MAX, subtype: 0xf },
        ] {
            let f = SglFields::read(&d.to_bytes());
            assert_eq!((f.sgl_type, f.subtype), (d.sgl_type(), d.subtype()));
            assert_eq!(Some(f.length), d.length());
        }
        let f = SglFields::read(&SglDescriptor::DataBlock { address: 0x1234, length: 5, subtype: 0 }.to_bytes());
        assert_eq!(f.address, 0x1234);
    }

    #[test]
    fn unkeyed_layout() {
        // What the Linux NVMe/TCP host sends: in-capsule data at offset icdoff, type 0 subtype 1;
        // otherwise a Transport SGL Data Block, type 5 subtype Ah, address 0.
        let b = SglDescriptor::in_capsule(0, 0x1000).to_bytes();
        assert_eq!(b, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 0, 0, 0x01]);
        let b = SglDescriptor::transport(0x0002_0000).to_bytes();
        assert_eq!(b, [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0x5a]);
        assert_eq!(SglDescriptor::decode(&b), SglDescriptor::transport(0x2_0000));
        let seg = SglDescriptor::LastSegment { address: 0x10, length: 32, subtype: 1 };
        assert_eq!(seg.to_bytes()[15], 0x31);
        assert_eq!(SglDescriptor::decode(&seg.to_bytes()).sgl_type(), sgl_type::LAST_SEGMENT);
        let mut other = [0u8; 16];
        other[15] = 0xf3;
        assert_eq!(SglDescriptor::decode(&other), SglDescriptor::Other(other));
        assert_eq!(SglDescriptor::Other(other).sgl_type(), sgl_type::VENDOR_SPECIFIC);
        assert_eq!(SglDescriptor::Other(other).subtype(), 3);
        assert_eq!(SglDescriptor::Other(other).length(), None);
    }

    pub(crate) fn sgl() -> impl Strategy<Value = SglDescriptor> {
        let parts = (0u8..7, any::<u64>(), any::<u32>(), any::<u32>(), 0u8..16, 6u8..16);
        (parts, any::<[u8; 16]>()).prop_map(|((kind, address, length, key, subtype, t), raw)| match kind {
            0 => SglDescriptor::DataBlock { address, length, subtype },
            1 => SglDescriptor::BitBucket { address, length, subtype },
            2 => SglDescriptor::Segment { address, length, subtype },
            3 => SglDescriptor::LastSegment { address, length, subtype },
            4 => SglDescriptor::KeyedDataBlock {
                address,
                length: length & SglDescriptor::KEYED_LENGTH_MAX,
                key,
                subtype,
            },
            5 => SglDescriptor::TransportDataBlock { address, length, subtype },
            _ => {
                let mut b = raw;
                b[15] = (t << 4) | (b[15] & 0xf);
                SglDescriptor::Other(b)
            }
        })
    }

    proptest! {
        #[test]
        fn round_trip(d in sgl()) {
            prop_assert_eq!(SglDescriptor::decode(&d.to_bytes()), d);
        }

        #[test]
        fn decode_any(b in any::<[u8; 16]>()) {
            let d = SglDescriptor::decode(&b);
            prop_assert_eq!(SglDescriptor::decode(&d.to_bytes()), d);
            prop_assert_eq!(d.sgl_type(), b[15] >> 4);
            prop_assert_eq!(d.subtype(), b[15] & 0xf);
        }
    }
}
