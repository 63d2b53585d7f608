//! SPDK's RAID superblock (module/bdev/raid/bdev_raid.h and bdev_raid_sb.c, v26.05), byte for
//! byte: written at the start of every member of a RAID made with `superblock: true`, so that
//! the RAID assembles itself when its members appear (examine), in Ferrite or in SPDK.
//!
//! Layout, little-endian: a 256-byte header ("SPDKRAID", version 1.0, length, CRC-32C of the
//! whole superblock with the CRC field zero, seeded with 0 and not inverted as SPDK's
//! `spdk_crc32c_update(sb, len, 0)`, flags, the RAID's UUID and name, size in blocks, block size,
//! level, strip size in blocks, state, sequence number, member count) and one 64-byte entry per
//! member (UUID, data offset and size in blocks, state, flags, slot). The sequence number grows
//! on every write: a member whose copy is older than the RAID's is not trusted.

use uuid::Uuid;

/// "SPDKRAID".
pub const SIGNATURE: &[u8; 8] = b"SPDKRAID";
/// Major version Ferrite reads and writes.
pub const VERSION_MAJOR: u16 = 1;
/// Minor version Ferrite writes.
pub const VERSION_MINOR: u16 = 0;
/// Bytes of the header.
pub const HEADER_LEN: usize = 256;
/// Bytes of one member entry.
pub const ENTRY_LEN: usize = 64;
/// Longest superblock (255 members).
pub const MAX_LEN: usize = HEADER_LEN + 255 * ENTRY_LEN;
/// Bytes of the name field (with its NUL: names are at most 63 bytes).
pub const NAME_LEN: usize = 64;
/// Where the data region starts on a member, at least (SPDK's `RAID_BDEV_MIN_DATA_OFFSET_SIZE`).
pub const MIN_DATA_OFFSET_BYTES: u64 = 1 << 20;

/// A member entry's state (`enum raid_bdev_sb_base_bdev_state`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberState {
    /// Not there (removed).
    Missing,
    /// An active member.
    Configured,
    /// Removed after a failure.
    Failed,
    /// A spare.
    Spare,
    /// A state Ferrite does not know.
    Other(u32),
}

impl MemberState {
    fn to_u32(self) -> u32 {
        match self {
            MemberState::Missing => 0,
            MemberState::Configured => 1,
            MemberState::Failed => 2,
            MemberState::Spare => 3,
            MemberState::Other(v) => v,
        }
    }

    fn from_u32(v: u32) -> Self {
        match v {
            0 => MemberState::Missing,
            1 => MemberState::Configured,
            2 => MemberState::Failed,
            3 => MemberState::Spare,
            v => MemberState::Other(v),
        }
    }
}

/// One member's entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The member bdev's UUID.
    pub uuid: Uuid,
    /// Where its data region starts, in blocks.
    pub data_offset: u64,
    /// Its data region's size, in blocks.
    pub data_size: u64,
    /// Its state.
    pub state: MemberState,
    /// Flags (none defined).
    pub flags: u32,
    /// Its slot in the RAID.
    pub slot: u8,
}

/// A RAID superblock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    /// Minor version read (Ferrite writes [`VERSION_MINOR`]).
    pub minor: u16,
    /// Flags (none defined).
    pub flags: u32,
    /// The RAID bdev's UUID.
    pub uuid: Uuid,
    /// The RAID bdev's name.
    pub name: String,
    /// The RAID bdev's size in blocks.
    pub raid_size: u64,
    /// Block size of the RAID and of every member.
    pub block_size: u32,
    /// SPDK's number of the level.
    pub level: u32,
    /// Strip size in blocks.
    pub strip_size: u32,
    /// The RAID's state (SPDK writes 0).
    pub state: u32,
    /// Grows with every write of the superblock.
    pub seq_number: u64,
    /// Members of the RAID (slots).
    pub num_base_bdevs: u8,
    /// Member entries.
    pub members: Vec<Member>,
}

/// Why bytes are not a superblock Ferrite takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SbError {
    /// No superblock: the signature, CRC, version or a slot is wrong (SPDK's -EINVAL).
    Invalid(String),
    /// The superblock is longer than the bytes given: read this many and parse again.
    Short(usize),
}

/// SPDK's `spdk_crc32c_update(buf, len, 0)`: CRC-32C without the initial and final inversion.
pub fn crc32c_raw(data: &[u8]) -> u32 {
    !crc32c::crc32c_append(!0u32, data)
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes(b[at..at + 2].try_into().unwrap())
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}
fn uuid_at(b: &[u8], at: usize) -> Uuid {
    Uuid::from_bytes(b[at..at + 16].try_into().unwrap())
}

impl Superblock {
    /// Bytes the superblock takes on disk.
    pub fn len(&self) -> usize {
        HEADER_LEN + self.members.len() * ENTRY_LEN
    }

    /// False: a superblock always has its header.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The superblock as SPDK writes it, padded with zeroes to `pad_to` bytes (a multiple of
    /// the block size), with its CRC.
    pub fn encode(&self, pad_to: usize) -> Vec<u8> {
        debug_assert!(self.members.len() <= 255 && self.name.len() < NAME_LEN);
        let len = self.len();
        let mut b = vec![0u8; pad_to.max(len)];
        b[0..8].copy_from_slice(SIGNATURE);
        b[8..10].copy_from_slice(&VERSION_MAJOR.to_le_bytes());
        b[10..12].copy_from_slice(&VERSION_MINOR.to_le_bytes());
        b[12..16].copy_from_slice(&(len as u32).to_le_bytes());
        b[20..24].copy_from_slice(&self.flags.to_le_bytes());
        b[24..40].copy_from_slice(self.uuid.as_bytes());
        let name = self.name.as_bytes();
        let n = name.len().min(NAME_LEN - 1);
        b[40..40 + n].copy_from_slice(&name[..n]);
        b[104..112].copy_from_slice(&self.raid_size.to_le_bytes());
        b[112..116].copy_from_slice(&self.block_size.to_le_bytes());
        b[116..120].copy_from_slice(&self.level.to_le_bytes());
        b[120..124].copy_from_slice(&self.strip_size.to_le_bytes());
        b[124..128].copy_from_slice(&self.state.to_le_bytes());
        b[128..136].copy_from_slice(&self.seq_number.to_le_bytes());
        b[136] = self.num_base_bdevs;
        b[255] = self.members.len() as u8;
        for (i, m) in self.members.iter().enumerate() {
            let e = &mut b[HEADER_LEN + i * ENTRY_LEN..HEADER_LEN + (i + 1) * ENTRY_LEN];
            e[0..16].copy_from_slice(m.uuid.as_bytes());
            e[16..24].copy_from_slice(&m.data_offset.to_le_bytes());
            e[24..32].copy_from_slice(&m.data_size.to_le_bytes());
            e[32..36].copy_from_slice(&m.state.to_u32().to_le_bytes());
            e[36..40].copy_from_slice(&m.flags.to_le_bytes());
            e[40] = m.slot;
        }
        let crc = crc32c_raw(&b[..len]);
        b[16..20].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Parses a superblock from the first bytes of a member (SPDK's
    /// `raid_bdev_parse_superblock`).
    pub fn decode(b: &[u8]) -> Result<Superblock, SbError> {
        if b.len() < HEADER_LEN {
            return Err(SbError::Short(HEADER_LEN));
        }
        if &b[0..8] != SIGNATURE {
            return Err(SbError::Invalid("no RAID superblock signature".into()));
        }
        let len = u32_at(b, 12) as usize;
        if !(HEADER_LEN..=MAX_LEN).contains(&len) {
            return Err(SbError::Invalid(format!("superblock length {len} is out of bounds")));
        }
        if len > b.len() {
            return Err(SbError::Short(len));
        }
        let mut copy = b[..len].to_vec();
        copy[16..20].fill(0);
        let crc = u32_at(b, 16);
        if crc32c_raw(&copy) != crc {
            return Err(SbError::Invalid("superblock CRC mismatch".into()));
        }
        let major = u16_at(b, 8);
        if major != VERSION_MAJOR {
            return Err(SbError::Invalid(format!("superblock major version {major} is not supported")));
        }
        let num = b[136];
        let size = b[255] as usize;
        if HEADER_LEN + size * ENTRY_LEN > len {
            return Err(SbError::Invalid("superblock member entries exceed its length".into()));
        }
        let mut members = Vec::with_capacity(size);
        for i in 0..size {
            let e = &b[HEADER_LEN + i * ENTRY_LEN..HEADER_LEN + (i + 1) * ENTRY_LEN];
            let slot = e[40];
            if slot >= num {
                return Err(SbError::Invalid(format!("superblock member slot {slot} is not below {num}")));
            }
            members.push(Member {
                uuid: uuid_at(e, 0),
                data_offset: u64_at(e, 16),
                data_size: u64_at(e, 24),
                state: MemberState::from_u32(u32_at(e, 32)),
                flags: u32_at(e, 36),
                slot,
            });
        }
        let name_end = b[40..104].iter().position(|&c| c == 0).unwrap_or(NAME_LEN);
        Ok(Superblock {
            minor: u16_at(b, 10),
            flags: u32_at(b, 20),
            uuid: uuid_at(b, 24),
            name: String::from_utf8_lossy(&b[40..40 + name_end]).into_owned(),
            raid_size: u64_at(b, 104),
            block_size: u32_at(b, 112),
            level: u32_at(b, 116),
            strip_size: u32_at(b, 120),
            state: u32_at(b, 124),
            seq_number: u64_at(b, 128),
            num_base_bdevs: num,
            members,
        })
    }

    /// The entry of the member with `uuid`.
    pub fn member(&self, uuid: &Uuid) -> Option<&Member> {
        self.members.iter().find(|m| &m.uuid == uuid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CRC-32C bit by bit (reflected polynomial 0x82F63B78), seeded with 0, no final inversion.
    fn crc_reference(data: &[u8]) -> u32 {
        let mut crc = 0u32;
        for &byte in data {
            crc ^= byte as u32;
            for _ in 0..8 {
                crc = if crc & 1 != 0 { (crc >> 1) ^ 0x82F6_3B78 } else { crc >> 1 };
            }
        }
        crc
    }

    fn sample() -> Superblock {
        Superblock {
            minor: 0,
            flags: 0,
            uuid: Uuid::from_u128(0x0123_4567_89ab_cdef_0011_2233_4455_6677),
            name: "r1".into(),
            raid_size: 63488,
            block_size: 512,
            level: 1,
            strip_size: 0,
            state: 0,
            seq_number: 3,
            num_base_bdevs: 2,
            members: (0..2)
                .map(|i| Member {
                    uuid: Uuid::from_u128(100 + i as u128),
                    data_offset: 2048,
                    data_size: 63488,
                    state: MemberState::Configured,
                    flags: 0,
                    slot: i,
                })
                .collect(),
        }
    }

    #[test]
    fn the_crc_is_spdks_unseeded_uninverted_crc32c() {
        for data in [&b""[..], b"a", b"123456789", &[0u8; 300][..]] {
            assert_eq!(crc32c_raw(data), crc_reference(data));
        }
    }

    #[test]
    fn a_superblock_round_trips_with_spdks_layout() {
        let sb = sample();
        let b = sb.encode(512);
        assert_eq!(b.len(), 512);
        assert_eq!(&b[..8], b"SPDKRAID");
        assert_eq!(u32_at(&b, 12), 256 + 2 * 64);
        assert_eq!(u64_at(&b, 128), 3, "sequence number at 128");
        assert_eq!(b[136], 2);
        assert_eq!(b[255], 2);
        assert_eq!(b[256 + 64 + 40], 1, "second entry's slot");
        assert_eq!(Superblock::decode(&b).unwrap(), sb);
    }

    #[test]
    fn damaged_or_short_superblocks_are_refused() {
        let sb = sample();
        let mut b = sb.encode(512);
        assert_eq!(Superblock::decode(&b[..300]), Err(SbError::Short(384)));
        b[300] ^= 1;
        assert!(matches!(Superblock::decode(&b), Err(SbError::Invalid(_))));
        assert!(matches!(Superblock::decode(&[0u8; 512]), Err(SbError::Invalid(_))));
        let mut big = sample();
        big.members[1].slot = 7;
        assert!(matches!(Superblock::decode(&big.encode(512)), Err(SbError::Invalid(_))));
    }
}
