//! Errors of the format codec.

use std::fmt;

/// Why bytes are not a valid piece of SPDK blobstore metadata (or a value cannot be encoded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FormatError {
    /// The buffer is shorter than the structure it should hold.
    Truncated {
        /// What was being decoded.
        what: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes given.
        got: usize,
    },
    /// The super block does not start with "SPDKBLOB".
    BadSignature([u8; 8]),
    /// A super block version SPDK v26.05 does not load (it accepts 1 to 3).
    UnsupportedVersion(u32),
    /// A stored CRC32C does not match the bytes.
    BadCrc {
        /// What was being decoded.
        what: &'static str,
        /// CRC stored on disk.
        stored: u32,
        /// CRC computed over the bytes.
        computed: u32,
    },
    /// A super block field has a value no blobstore can have.
    BadGeometry(String),
    /// A region of the super block (a mask or the md region) is not inside the device, or
    /// overlaps another.
    RegionOutOfBounds {
        /// Which region.
        region: &'static str,
        /// First md page of the region.
        start: u64,
        /// Length in md pages.
        len: u64,
        /// What it must fit in, in md pages.
        limit: u64,
    },
    /// A mask's type byte is not the expected one.
    BadMaskType {
        /// Type expected.
        expected: u8,
        /// Type found.
        found: u8,
    },
    /// A mask claims more bits than its region holds.
    MaskTooLong {
        /// Bits claimed.
        bits: u32,
        /// Bits the region can hold.
        capacity: u64,
    },
    /// A descriptor's length runs past the end of the page's descriptor area.
    DescriptorOverrun {
        /// Descriptor type.
        desc_type: u8,
        /// Offset of the descriptor in the area.
        offset: usize,
        /// Its length field.
        length: u32,
    },
    /// A descriptor's length is not what its type requires.
    BadDescriptorLength {
        /// Descriptor type.
        desc_type: u8,
        /// Its length field.
        length: u32,
    },
    /// A blob's pages are not a valid chain (wrong id, sequence number, ...).
    BadChain(String),
    /// The descriptors of a blob contradict each other (SPDK refuses such a blob with -EINVAL).
    InconsistentBlob(String),
    /// A count exceeds the configured limit (protects against absurd allocations).
    TooLarge {
        /// What was counted.
        what: &'static str,
        /// The count.
        count: u64,
        /// The limit.
        limit: u64,
    },
    /// A value cannot be encoded (e.g. an xattr larger than a page).
    Unencodable(String),
}

impl fmt::Display for FormatError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FormatError::Truncated { what, need, got } => {
                write!(f, "{what}: need {need} bytes, got {got}")
            }
            FormatError::BadSignature(sig) => {
                write!(f, "not a blobstore: signature {:?} is not \"SPDKBLOB\"", String::from_utf8_lossy(sig))
            }
            FormatError::UnsupportedVersion(v) => {
                write!(f, "super block version {v} is not supported (1 to 3 are)")
            }
            FormatError::BadCrc { what, stored, computed } => {
                write!(f, "{what}: crc mismatch (stored {stored:#010x}, computed {computed:#010x})")
            }
            FormatError::BadGeometry(m) => write!(f, "bad super block geometry: {m}"),
            FormatError::RegionOutOfBounds { region, start, len, limit } => write!(
                f,
                "{region} (md pages {start}..{}) is outside the usable {limit} pages",
                start.saturating_add(*len)
            ),
            FormatError::BadMaskType { expected, found } => {
                write!(f, "mask type {found}, expected {expected}")
            }
            FormatError::MaskTooLong { bits, capacity } => {
                write!(f, "mask of {bits} bits does not fit its region ({capacity} bits)")
            }
            FormatError::DescriptorOverrun { desc_type, offset, length } => {
                write!(f, "descriptor type {desc_type} at offset {offset} with length {length} runs past the page")
            }
            FormatError::BadDescriptorLength { desc_type, length } => {
                write!(f, "descriptor type {desc_type} has an invalid length {length}")
            }
            FormatError::BadChain(m) => write!(f, "bad md page chain: {m}"),
            FormatError::InconsistentBlob(m) => write!(f, "inconsistent blob metadata: {m}"),
            FormatError::TooLarge { what, count, limit } => {
                write!(f, "{what}: {count} exceeds the limit of {limit}")
            }
            FormatError::Unencodable(m) => write!(f, "cannot encode: {m}"),
        }
    }
}

impl std::error::Error for FormatError {}

/// Checks that `buf` holds at least `need` bytes.
pub(crate) fn need(what: &'static str, buf: &[u8], need: usize) -> Result<(), FormatError> {
    if buf.len() < need {
        return Err(FormatError::Truncated { what, need, got: buf.len() });
    }
    Ok(())
}

/// Little-endian field readers on a slice whose length the caller has checked.
pub(crate) fn le_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

/// Reads a little-endian u32 at `at`.
pub(crate) fn le_u32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Reads a little-endian u64 at `at`.
pub(crate) fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}
