//! The descriptors in a metadata page's descriptor area.
//!
//! Every descriptor starts with a 5-byte header, `type: u8, length: u32` (length of the body
//! that follows), and descriptors follow each other without alignment:
//!
//! ```text
//! type 0  padding         body ignored; type 0 with length 0 ends the page
//! type 1  extent RLE      { cluster_idx: u32, length: u32 }*  runs of clusters; cluster_idx is
//!                         a cluster index on the device (0: unallocated), length in clusters
//! type 2  xattr           name_length: u16, value_length: u16, name, value
//! type 3  flags           invalid_flags: u64, data_ro_flags: u64, md_ro_flags: u64
//! type 4  internal xattr  as type 2
//! type 5  extent table    num_clusters: u64, { page_idx: u32, num_pages: u32 }*  md page of
//!                         each extent page; page_idx 0 is a run of num_pages absent ones
//! type 6  extent page     start_cluster_idx: u32, cluster_idx: u32*  (only in extent pages)
//! ```
//!
//! Parsing follows SPDK's `blob_parse_page`: it stops at the terminator, or when the next header
//! would not fit in the area, or after a padding or unknown descriptor whose length runs past
//! the area (SPDK skips those and stops). A known descriptor whose body runs past the area, or
//! whose length is not what its type needs, is an error. Lengths are checked before anything is
//! allocated, and every step advances by at least the 5-byte header, so no input loops.

use super::error::{le_u16, le_u32, le_u64, FormatError};
use super::DESC_AREA_SIZE;

/// Size of a descriptor header (type and length).
pub const HEADER_SIZE: usize = 5;

/// Descriptor type of padding (and, with length 0, the end of a page).
pub const TYPE_PADDING: u8 = 0;
/// Descriptor type of an extent RLE descriptor.
pub const TYPE_EXTENT_RLE: u8 = 1;
/// Descriptor type of an xattr.
pub const TYPE_XATTR: u8 = 2;
/// Descriptor type of the flags.
pub const TYPE_FLAGS: u8 = 3;
/// Descriptor type of an internal xattr.
pub const TYPE_XATTR_INTERNAL: u8 = 4;
/// Descriptor type of an extent table.
pub const TYPE_EXTENT_TABLE: u8 = 5;
/// Descriptor type of an extent page's descriptor.
pub const TYPE_EXTENT_PAGE: u8 = 6;

/// Body length of the flags descriptor.
pub const FLAGS_BODY_LEN: u32 = 24;

/// One run of an extent RLE descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RleExtent {
    /// Device cluster index of the first cluster of the run; 0 for a run of unallocated clusters.
    pub cluster_idx: u32,
    /// Run length in clusters.
    pub length: u32,
}

/// One entry of an extent table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExtentTableEntry {
    /// Md page index of an extent page, or 0 for a run of `num_pages` absent extent pages.
    pub page_idx: u32,
    /// Number of extent pages this entry stands for (1 when `page_idx` is not 0).
    pub num_pages: u32,
}

/// A decoded descriptor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Descriptor {
    /// Padding with a non-zero length (the terminator is not returned).
    Padding {
        /// Body length.
        length: u32,
    },
    /// Extent RLE (type 1).
    ExtentRle(Vec<RleExtent>),
    /// An xattr (type 2) or internal xattr (type 4).
    Xattr {
        /// Type 4 rather than 2.
        internal: bool,
        /// Name bytes (no terminating NUL on disk).
        name: Vec<u8>,
        /// Value bytes.
        value: Vec<u8>,
    },
    /// Flags (type 3).
    Flags {
        /// Flags an implementation must understand to open the blob at all.
        invalid: u64,
        /// Flags an implementation must understand to write the blob's data.
        data_ro: u64,
        /// Flags an implementation must understand to change the blob's metadata.
        md_ro: u64,
    },
    /// Extent table (type 5).
    ExtentTable {
        /// Number of clusters of the blob.
        num_clusters: u64,
        /// The entries.
        entries: Vec<ExtentTableEntry>,
    },
    /// Extent page descriptor (type 6).
    ExtentPage {
        /// Blob cluster index of the first entry.
        start_cluster_idx: u32,
        /// Device cluster index of each blob cluster from `start_cluster_idx` on (0: unallocated).
        cluster_idx: Vec<u32>,
    },
    /// A type this implementation does not know; SPDK skips those too (a newer feature that
    /// matters would also set a flag the reader does not know).
    Unknown {
        /// The type byte.
        desc_type: u8,
        /// The body.
        body: Vec<u8>,
    },
}

impl Descriptor {
    /// The descriptor's type byte.
    pub fn desc_type(&self) -> u8 {
        match self {
            Descriptor::Padding { .. } => TYPE_PADDING,
            Descriptor::ExtentRle(_) => TYPE_EXTENT_RLE,
            Descriptor::Xattr { internal: false, .. } => TYPE_XATTR,
            Descriptor::Xattr { internal: true, .. } => TYPE_XATTR_INTERNAL,
            Descriptor::Flags { .. } => TYPE_FLAGS,
            Descriptor::ExtentTable { .. } => TYPE_EXTENT_TABLE,
            Descriptor::ExtentPage { .. } => TYPE_EXTENT_PAGE,
            Descriptor::Unknown { desc_type, .. } => *desc_type,
        }
    }

    /// Length of the body (the header's length field).
    pub fn body_len(&self) -> usize {
        match self {
            Descriptor::Padding { length } => *length as usize,
            Descriptor::ExtentRle(e) => 8 * e.len(),
            Descriptor::Xattr { name, value, .. } => 4 + name.len() + value.len(),
            Descriptor::Flags { .. } => FLAGS_BODY_LEN as usize,
            Descriptor::ExtentTable { entries, .. } => 8 + 8 * entries.len(),
            Descriptor::ExtentPage { cluster_idx, .. } => 4 + 4 * cluster_idx.len(),
            Descriptor::Unknown { body, .. } => body.len(),
        }
    }

    /// Bytes the descriptor takes in a page, header included.
    pub fn encoded_len(&self) -> usize {
        HEADER_SIZE + self.body_len()
    }

    /// Writes the descriptor at the start of `out`, returning the bytes written. Fails if `out`
    /// is too short or a field does not fit its on-disk width.
    pub fn encode_into(&self, out: &mut [u8]) -> Result<usize, FormatError> {
        let n = self.encoded_len();
        if out.len() < n {
            return Err(FormatError::Unencodable(format!(
                "descriptor type {} of {n} bytes does not fit in {} bytes",
                self.desc_type(),
                out.len()
            )));
        }
        let body_len = u32::try_from(self.body_len())
            .map_err(|_| FormatError::Unencodable("descriptor body over 4 GiB".into()))?;
        out[0] = self.desc_type();
        out[1..5].copy_from_slice(&body_len.to_le_bytes());
        let body = &mut out[HEADER_SIZE..n];
        let mut w = Writer { buf: body, at: 0 };
        match self {
            Descriptor::Padding { .. } => body.fill(0),
            Descriptor::ExtentRle(extents) => {
                for e in extents {
                    w.u32(e.cluster_idx);
                    w.u32(e.length);
                }
            }
            Descriptor::Xattr { name, value, .. } => {
                let nl = u16::try_from(name.len())
                    .map_err(|_| FormatError::Unencodable("xattr name over 65535 bytes".into()))?;
                let vl = u16::try_from(value.len())
                    .map_err(|_| FormatError::Unencodable("xattr value over 65535 bytes".into()))?;
                w.u16(nl);
                w.u16(vl);
                w.bytes(name);
                w.bytes(value);
            }
            Descriptor::Flags { invalid, data_ro, md_ro } => {
                w.u64(*invalid);
                w.u64(*data_ro);
                w.u64(*md_ro);
            }
            Descriptor::ExtentTable { num_clusters, entries } => {
                w.u64(*num_clusters);
                for e in entries {
                    w.u32(e.page_idx);
                    w.u32(e.num_pages);
                }
            }
            Descriptor::ExtentPage { start_cluster_idx, cluster_idx } => {
                w.u32(*start_cluster_idx);
                for &c in cluster_idx {
                    w.u32(c);
                }
            }
            Descriptor::Unknown { body: b, .. } => w.bytes(b),
        }
        Ok(n)
    }

    /// Decodes the body of a descriptor of type `desc_type` (`body` is exactly its length).
    fn decode_body(desc_type: u8, body: &[u8]) -> Result<Descriptor, FormatError> {
        let length = body.len() as u32;
        let bad = || FormatError::BadDescriptorLength { desc_type, length };
        Ok(match desc_type {
            TYPE_PADDING => Descriptor::Padding { length },
            TYPE_EXTENT_RLE => {
                if body.is_empty() || !body.len().is_multiple_of(8) {
                    return Err(bad());
                }
                Descriptor::ExtentRle(
                    body.chunks_exact(8)
                        .map(|c| RleExtent { cluster_idx: le_u32(c, 0), length: le_u32(c, 4) })
                        .collect(),
                )
            }
            TYPE_XATTR | TYPE_XATTR_INTERNAL => {
                if body.len() < 4 {
                    return Err(bad());
                }
                let nl = le_u16(body, 0) as usize;
                let vl = le_u16(body, 2) as usize;
                if body.len() != 4 + nl + vl {
                    return Err(bad());
                }
                Descriptor::Xattr {
                    internal: desc_type == TYPE_XATTR_INTERNAL,
                    name: body[4..4 + nl].to_vec(),
                    value: body[4 + nl..].to_vec(),
                }
            }
            TYPE_FLAGS => {
                if length != FLAGS_BODY_LEN {
                    return Err(bad());
                }
                Descriptor::Flags { invalid: le_u64(body, 0), data_ro: le_u64(body, 8), md_ro: le_u64(body, 16) }
            }
            TYPE_EXTENT_TABLE => {
                if body.len() < 8 || !(body.len() - 8).is_multiple_of(8) {
                    return Err(bad());
                }
                Descriptor::ExtentTable {
                    num_clusters: le_u64(body, 0),
                    entries: body[8..]
                        .chunks_exact(8)
                        .map(|c| ExtentTableEntry { page_idx: le_u32(c, 0), num_pages: le_u32(c, 4) })
                        .collect(),
                }
            }
            TYPE_EXTENT_PAGE => {
                if body.len() <= 4 || !(body.len() - 4).is_multiple_of(4) {
                    return Err(bad());
                }
                Descriptor::ExtentPage {
                    start_cluster_idx: le_u32(body, 0),
                    cluster_idx: body[4..].chunks_exact(4).map(|c| le_u32(c, 0)).collect(),
                }
            }
            _ => Descriptor::Unknown { desc_type, body: body.to_vec() },
        })
    }
}

/// Parses a page's descriptor area (normally [`DESC_AREA_SIZE`] bytes) into its descriptors.
pub fn parse_area(area: &[u8]) -> Result<Vec<Descriptor>, FormatError> {
    let mut out = Vec::new();
    let mut cur = 0usize;
    while cur + HEADER_SIZE <= area.len() {
        let desc_type = area[cur];
        let length = le_u32(area, cur + 1);
        if desc_type == TYPE_PADDING && length == 0 {
            break;
        }
        let end = (cur + HEADER_SIZE) as u64 + u64::from(length);
        if end > area.len() as u64 {
            let known = matches!(desc_type, TYPE_EXTENT_RLE..=TYPE_EXTENT_PAGE);
            if known {
                return Err(FormatError::DescriptorOverrun { desc_type, offset: cur, length });
            }
            // SPDK skips padding and unknown descriptors by their length, and stops here.
            break;
        }
        let end = end as usize;
        out.push(Descriptor::decode_body(desc_type, &area[cur + HEADER_SIZE..end])?);
        cur = end;
    }
    Ok(out)
}

/// Encodes descriptors one after the other into a zeroed descriptor area.
pub fn encode_area(descs: &[Descriptor]) -> Result<Box<[u8; DESC_AREA_SIZE]>, FormatError> {
    let mut area = Box::new([0u8; DESC_AREA_SIZE]);
    let mut at = 0;
    for d in descs {
        at += d.encode_into(&mut area[at..])?;
    }
    Ok(area)
}

/// Little-endian writer over a slice the caller sized.
struct Writer<'a> {
    buf: &'a mut [u8],
    at: usize,
}

impl Writer<'_> {
    fn bytes(&mut self, b: &[u8]) {
        self.buf[self.at..self.at + b.len()].copy_from_slice(b);
        self.at += b.len();
    }
    fn u16(&mut self, v: u16) {
        self.bytes(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_kinds() -> Vec<Descriptor> {
        vec![
            Descriptor::Flags { invalid: 5, data_ro: 1, md_ro: 2 },
            Descriptor::Xattr { internal: false, name: b"name".to_vec(), value: b"vol\0".to_vec() },
            Descriptor::Xattr { internal: true, name: b"SNAP".to_vec(), value: 7u64.to_le_bytes().to_vec() },
            Descriptor::Padding { length: 3 },
            Descriptor::ExtentRle(vec![
                RleExtent { cluster_idx: 4, length: 2 },
                RleExtent { cluster_idx: 0, length: 9 },
            ]),
            Descriptor::ExtentTable {
                num_clusters: 600,
                entries: vec![
                    ExtentTableEntry { page_idx: 12, num_pages: 1 },
                    ExtentTableEntry { page_idx: 0, num_pages: 1 },
                ],
            },
            Descriptor::ExtentPage { start_cluster_idx: 512, cluster_idx: vec![0, 7, 8] },
            Descriptor::Unknown { desc_type: 77, body: vec![1, 2, 3] },
        ]
    }

    #[test]
    fn round_trip_every_kind() {
        let descs = all_kinds();
        let area = encode_area(&descs).unwrap();
        assert_eq!(parse_area(&area[..]).unwrap(), descs);
        // Flags: type 3, length 24, three u64.
        assert_eq!(&area[..5], &[3, 24, 0, 0, 0]);
        assert_eq!(area[5], 5);
    }

    #[test]
    fn overrun_and_bad_lengths() {
        let mut area = [0u8; DESC_AREA_SIZE];
        area[0] = TYPE_XATTR;
        area[1..5].copy_from_slice(&5000u32.to_le_bytes());
        assert!(matches!(parse_area(&area), Err(FormatError::DescriptorOverrun { desc_type: 2, .. })));
        // Unknown type or padding with an overrunning length: skipped, parsing stops.
        area[0] = 99;
        assert_eq!(parse_area(&area).unwrap(), vec![]);
        area[0] = TYPE_FLAGS;
        area[1..5].copy_from_slice(&23u32.to_le_bytes());
        assert!(matches!(parse_area(&area), Err(FormatError::BadDescriptorLength { desc_type: 3, length: 23 })));
        area[0] = TYPE_EXTENT_RLE;
        area[1..5].copy_from_slice(&0u32.to_le_bytes());
        assert!(parse_area(&area).is_err());
        area[0] = TYPE_EXTENT_PAGE;
        area[1..5].copy_from_slice(&4u32.to_le_bytes());
        assert!(parse_area(&area).is_err());
        area[0] = TYPE_EXTENT_TABLE;
        area[1..5].copy_from_slice(&7u32.to_le_bytes());
        assert!(parse_area(&area).is_err());
        area[0] = TYPE_XATTR;
        area[1..5].copy_from_slice(&6u32.to_le_bytes());
        area[5..7].copy_from_slice(&1u16.to_le_bytes());
        area[7..9].copy_from_slice(&2u16.to_le_bytes());
        assert!(parse_area(&area).is_err()); // 4 + 1 + 2 != 6
    }

    #[test]
    fn header_that_does_not_fit_ends_the_area() {
        // Padding up to 3 bytes before the end: the next header cannot fit, parsing stops.
        let mut area = [0u8; DESC_AREA_SIZE];
        let len = (DESC_AREA_SIZE - 5 - 3) as u32;
        area[1..5].copy_from_slice(&len.to_le_bytes());
        area[DESC_AREA_SIZE - 3] = 0xff;
        assert_eq!(parse_area(&area).unwrap(), vec![Descriptor::Padding { length: len }]);
    }

    #[test]
    fn zero_length_descriptors_advance() {
        // Unknown type with length 0, repeated: each is 5 bytes, parsing ends.
        let mut area = [0u8; DESC_AREA_SIZE];
        for i in 0..DESC_AREA_SIZE / 5 {
            area[i * 5] = 200;
        }
        assert_eq!(parse_area(&area).unwrap().len(), DESC_AREA_SIZE / 5);
    }
}
