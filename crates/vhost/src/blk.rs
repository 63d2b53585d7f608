//! The virtio-blk device's wire format (VIRTIO 1.2, section 5.2): feature bits, request types and
//! statuses, the request header, discard and write-zeroes segments, and the configuration space.

/// Maximum size of any single segment is in `size_max`.
pub const F_SIZE_MAX: u64 = 1 << 1;
/// Maximum number of segments in a request is in `seg_max`.
pub const F_SEG_MAX: u64 = 1 << 2;
/// The device is read-only.
pub const F_RO: u64 = 1 << 5;
/// Block size of the disk is in `blk_size`.
pub const F_BLK_SIZE: u64 = 1 << 6;
/// Cache flush command support.
pub const F_FLUSH: u64 = 1 << 9;
/// The device exports information on optimal I/O alignment.
pub const F_TOPOLOGY: u64 = 1 << 10;
/// The device can toggle its cache between writeback and writethrough modes.
pub const F_CONFIG_WCE: u64 = 1 << 11;
/// The device supports more than one virtqueue.
pub const F_MQ: u64 = 1 << 12;
/// The device can take discard commands.
pub const F_DISCARD: u64 = 1 << 13;
/// The device can take write-zeroes commands.
pub const F_WRITE_ZEROES: u64 = 1 << 14;
/// The driver can use descriptors with the INDIRECT flag.
pub const F_INDIRECT_DESC: u64 = 1 << 28;
/// `used_event` and `avail_event` suppress notifications.
pub const F_EVENT_IDX: u64 = 1 << 29;
/// vhost-user: the protocol feature messages are understood.
pub const F_PROTOCOL_FEATURES: u64 = 1 << 30;
/// vhost's feature: the device marks what it writes in the dirty log (live migration).
pub const F_LOG_ALL: u64 = 1 << 26;
/// VIRTIO 1.0 or later.
pub const F_VERSION_1: u64 = 1 << 32;
/// The packed virtqueue layout (VIRTIO 1.2, 2.8).
pub const F_RING_PACKED: u64 = 1 << 34;

/// Offset of the config space's `writeback` field, the one the driver writes (CONFIG_WCE).
pub const WRITEBACK_OFFSET: usize = 32;

/// Read (device writes the guest's buffers).
pub const T_IN: u32 = 0;
/// Write.
pub const T_OUT: u32 = 1;
/// Flush the volatile cache.
pub const T_FLUSH: u32 = 4;
/// Get the device's serial (20 bytes).
pub const T_GET_ID: u32 = 8;
/// Discard ranges.
pub const T_DISCARD: u32 = 11;
/// Write zeroes to ranges.
pub const T_WRITE_ZEROES: u32 = 13;

/// Success.
pub const S_OK: u8 = 0;
/// Device or driver error.
pub const S_IOERR: u8 = 1;
/// Request unsupported by the device.
pub const S_UNSUPP: u8 = 2;

/// Bytes of the request header (`struct virtio_blk_outhdr`).
pub const HEADER_LEN: usize = 16;
/// Bytes of a discard / write-zeroes segment.
pub const SEGMENT_LEN: usize = 16;
/// Bytes of the serial that GET_ID returns.
pub const ID_LEN: usize = 20;
/// Sectors are 512 bytes in virtio-blk, whatever the block size.
pub const SECTOR: u64 = 512;

/// A request's header: what to do, where.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// `T_*`.
    pub kind: u32,
    /// First 512-byte sector.
    pub sector: u64,
}

impl Header {
    /// Decodes the 16 little-endian bytes of `struct virtio_blk_outhdr` (type, ioprio, sector).
    pub fn decode(b: &[u8; HEADER_LEN]) -> Self {
        Header {
            kind: u32::from_le_bytes(b[0..4].try_into().unwrap()),
            sector: u64::from_le_bytes(b[8..16].try_into().unwrap()),
        }
    }
}

/// One range of a discard or write-zeroes request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// First 512-byte sector.
    pub sector: u64,
    /// Sectors.
    pub num_sectors: u32,
    /// Bit 0: unmap allowed (write zeroes); other bits reserved.
    pub flags: u32,
}

impl Segment {
    /// Decodes `struct virtio_blk_discard_write_zeroes`.
    pub fn decode(b: &[u8; SEGMENT_LEN]) -> Self {
        Segment {
            sector: u64::from_le_bytes(b[0..8].try_into().unwrap()),
            num_sectors: u32::from_le_bytes(b[8..12].try_into().unwrap()),
            flags: u32::from_le_bytes(b[12..16].try_into().unwrap()),
        }
    }
}

/// What the configuration space shows the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Config {
    /// Capacity in 512-byte sectors.
    pub capacity: u64,
    /// Most bytes per segment.
    pub size_max: u32,
    /// Most data segments per request.
    pub seg_max: u32,
    /// Logical block size in bytes.
    pub blk_size: u32,
    /// log2(physical block / logical block).
    pub physical_block_exp: u8,
    /// Suggested minimum I/O size, in logical blocks.
    pub min_io_size: u16,
    /// Optimal I/O size (boundary), in logical blocks.
    pub opt_io_size: u32,
    /// 1: writeback cache (at [`WRITEBACK_OFFSET`]).
    pub writeback: u8,
    /// Request queues.
    pub num_queues: u16,
    /// Most sectors per discard segment.
    pub max_discard_sectors: u32,
    /// Most segments per discard request.
    pub max_discard_seg: u32,
    /// Discard alignment, in sectors.
    pub discard_sector_alignment: u32,
    /// Most sectors per write-zeroes segment.
    pub max_write_zeroes_sectors: u32,
    /// Most segments per write-zeroes request.
    pub max_write_zeroes_seg: u32,
    /// 1: a write zeroes with the unmap flag may deallocate.
    pub write_zeroes_may_unmap: u8,
}

/// Largest configuration read vhost-user carries (VHOST_USER_MAX_CONFIG_SIZE).
pub const MAX_CONFIG_LEN: usize = 256;

/// Bytes of the configuration space this device fills (up to the secure-erase fields, zero here).
pub const CONFIG_LEN: usize = 72;

impl Config {
    /// The configuration space's bytes (`struct virtio_blk_config`, little-endian).
    pub fn encode(&self) -> [u8; CONFIG_LEN] {
        let mut b = [0u8; CONFIG_LEN];
        b[0..8].copy_from_slice(&self.capacity.to_le_bytes());
        b[8..12].copy_from_slice(&self.size_max.to_le_bytes());
        b[12..16].copy_from_slice(&self.seg_max.to_le_bytes());
        // 16..20: geometry (none).
        b[20..24].copy_from_slice(&self.blk_size.to_le_bytes());
        b[24] = self.physical_block_exp;
        // 25: alignment offset (0).
        b[26..28].copy_from_slice(&self.min_io_size.to_le_bytes());
        b[28..32].copy_from_slice(&self.opt_io_size.to_le_bytes());
        b[WRITEBACK_OFFSET] = self.writeback;
        b[34..36].copy_from_slice(&self.num_queues.to_le_bytes());
        b[36..40].copy_from_slice(&self.max_discard_sectors.to_le_bytes());
        b[40..44].copy_from_slice(&self.max_discard_seg.to_le_bytes());
        b[44..48].copy_from_slice(&self.discard_sector_alignment.to_le_bytes());
        b[48..52].copy_from_slice(&self.max_write_zeroes_sectors.to_le_bytes());
        b[52..56].copy_from_slice(&self.max_write_zeroes_seg.to_le_bytes());
        b[56] = self.write_zeroes_may_unmap;
        // 60..72: secure erase (not offered).
        b
    }

    /// The bytes `[offset, offset + len)` of the space, or None if that is not inside the
    /// largest space vhost-user carries ([`MAX_CONFIG_LEN`]). Fields past the ones this device
    /// fills (the zoned ones a newer driver asks for) read as zero.
    pub fn read(&self, offset: u32, len: u32) -> Option<Vec<u8>> {
        let end = offset.checked_add(len)? as usize;
        if end > MAX_CONFIG_LEN {
            return None;
        }
        let mut all = [0u8; MAX_CONFIG_LEN];
        all[..CONFIG_LEN].copy_from_slice(&self.encode());
        Some(all[offset as usize..end].to_vec())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_and_segment_decode_little_endian_fields() {
        let mut h = [0u8; HEADER_LEN];
        h[0] = 1;
        h[4] = 0xff; // ioprio: ignored
        h[8..16].copy_from_slice(&0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(Header::decode(&h), Header { kind: T_OUT, sector: 0x0102_0304_0506_0708 });
        let mut s = [0u8; SEGMENT_LEN];
        s[0..8].copy_from_slice(&99u64.to_le_bytes());
        s[8..12].copy_from_slice(&8u32.to_le_bytes());
        s[12..16].copy_from_slice(&1u32.to_le_bytes());
        assert_eq!(Segment::decode(&s), Segment { sector: 99, num_sectors: 8, flags: 1 });
    }

    #[test]
    fn config_fields_sit_at_the_spec_offsets() {
        let c = Config {
            capacity: 0x1122,
            size_max: 1 << 20,
            seg_max: 126,
            blk_size: 4096,
            physical_block_exp: 0,
            min_io_size: 1,
            opt_io_size: 32,
            writeback: 1,
            num_queues: 2,
            max_discard_sectors: 7,
            max_discard_seg: 1,
            discard_sector_alignment: 8,
            max_write_zeroes_sectors: 9,
            max_write_zeroes_seg: 1,
            write_zeroes_may_unmap: 1,
        };
        let b = c.encode();
        assert_eq!(u64::from_le_bytes(b[0..8].try_into().unwrap()), 0x1122);
        assert_eq!(u32::from_le_bytes(b[20..24].try_into().unwrap()), 4096);
        assert_eq!(u32::from_le_bytes(b[28..32].try_into().unwrap()), 32);
        assert_eq!(b[32], 1);
        assert_eq!(u16::from_le_bytes(b[34..36].try_into().unwrap()), 2);
        assert_eq!(u32::from_le_bytes(b[44..48].try_into().unwrap()), 8);
        assert_eq!(u32::from_le_bytes(b[48..52].try_into().unwrap()), 9);
        assert_eq!(b[56], 1);
        assert_eq!(c.read(20, 4).unwrap(), 4096u32.to_le_bytes());
        assert_eq!(c.read(60, 36).unwrap(), vec![0u8; 36], "zoned fields a newer driver asks for read as zero");
        assert!(c.read(250, 8).is_none(), "past the largest space");
        assert!(c.read(u32::MAX, 2).is_none(), "overflow");
    }
}
