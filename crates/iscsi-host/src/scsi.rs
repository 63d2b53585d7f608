//! The SCSI the initiator speaks (SPC-4, SBC-3), without I/O: the CDBs it sends, the data it
//! parses (INQUIRY, the Block Limits and Logical Block Provisioning VPD pages, READ CAPACITY,
//! the caching mode page), sense data, and what a command's status means for its bdev request.

use ferrite_bdev::IoStatus;

/// SCSI status codes (SAM-5).
pub mod status {
    /// GOOD.
    pub const GOOD: u8 = 0x00;
    /// CHECK CONDITION: sense data says why.
    pub const CHECK_CONDITION: u8 = 0x02;
    /// CONDITION MET.
    pub const CONDITION_MET: u8 = 0x04;
    /// BUSY.
    pub const BUSY: u8 = 0x08;
    /// RESERVATION CONFLICT.
    pub const RESERVATION_CONFLICT: u8 = 0x18;
    /// TASK SET FULL.
    pub const TASK_SET_FULL: u8 = 0x28;
}

/// Sense keys the initiator acts on.
pub mod key {
    /// NOT READY.
    pub const NOT_READY: u8 = 0x2;
    /// ILLEGAL REQUEST.
    pub const ILLEGAL_REQUEST: u8 = 0x5;
    /// UNIT ATTENTION.
    pub const UNIT_ATTENTION: u8 = 0x6;
}

/// A CDB, zero-padded to the 16 bytes of the SCSI Command PDU (the opcode says its length).
pub type Cdb = [u8; 16];

/// Most UNMAP block descriptors one command carries.
pub const MAX_UNMAP_DESCRIPTORS: u32 = 64;

fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_be_bytes());
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn be64(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(v)
}

/// TEST UNIT READY.
pub fn test_unit_ready() -> Cdb {
    [0; 16]
}

/// INQUIRY: standard data, or VPD page `page`, `alloc` bytes at most.
pub fn inquiry(vpd: Option<u8>, alloc: u16) -> Cdb {
    let mut c = [0u8; 16];
    c[0] = 0x12;
    if let Some(p) = vpd {
        c[1] = 1;
        c[2] = p;
    }
    c[3..5].copy_from_slice(&alloc.to_be_bytes());
    c
}

/// READ CAPACITY (10).
pub fn read_capacity10() -> Cdb {
    let mut c = [0u8; 16];
    c[0] = 0x25;
    c
}

/// READ CAPACITY (16) (SERVICE ACTION IN (16), service action 10h), 32 bytes of data.
pub fn read_capacity16() -> Cdb {
    let mut c = [0u8; 16];
    c[0] = 0x9e;
    c[1] = 0x10;
    put32(&mut c, 10, READ_CAPACITY16_LEN);
    c
}

/// Bytes of READ CAPACITY (16) data asked for.
pub const READ_CAPACITY16_LEN: u32 = 32;

/// MODE SENSE (10) of the caching page (08h), current values, no block descriptors.
pub fn mode_sense_caching(alloc: u16) -> Cdb {
    let mut c = [0u8; 16];
    c[0] = 0x5a;
    c[1] = 0x08;
    c[2] = 0x08;
    c[7..9].copy_from_slice(&alloc.to_be_bytes());
    c
}

/// READ (16) of `blocks` at `lba`.
pub fn read16(lba: u64, blocks: u32) -> Cdb {
    let mut c = [0u8; 16];
    c[0] = 0x88;
    put64(&mut c, 2, lba);
    put32(&mut c, 10, blocks);
    c
}

/// WRITE (16) of `blocks` at `lba`, FUA if asked.
pub fn write16(lba: u64, blocks: u32, fua: bool) -> Cdb {
    let mut c = [0u8; 16];
    c[0] = 0x8a;
    if fua {
        c[1] = 0x08;
    }
    put64(&mut c, 2, lba);
    put32(&mut c, 10, blocks);
    c
}

/// SYNCHRONIZE CACHE (16) of the whole medium.
pub fn synchronize_cache16() -> Cdb {
    let mut c = [0u8; 16];
    c[0] = 0x91;
    c
}

/// UNMAP with a parameter list of `list_len` bytes.
pub fn unmap(list_len: u16) -> Cdb {
    let mut c = [0u8; 16];
    c[0] = 0x42;
    c[7..9].copy_from_slice(&list_len.to_be_bytes());
    c
}

/// Bytes of an UNMAP parameter list of `n` block descriptors.
pub fn unmap_list_len(n: usize) -> usize {
    8 + 16 * n
}

/// Writes the UNMAP parameter list for `blocks` blocks from `lba` into `out` (at least
/// [`unmap_list_len`] of the descriptor count bytes), in descriptors of at most `max_per`
/// blocks; returns its length, or None if it takes more than `max_descriptors`.
pub fn unmap_list(lba: u64, blocks: u64, max_per: u32, max_descriptors: u32, out: &mut [u8]) -> Option<usize> {
    let per = u64::from(max_per.max(1));
    let n = blocks.div_ceil(per);
    if n == 0 || n > u64::from(max_descriptors) || out.len() < unmap_list_len(n as usize) {
        return None;
    }
    let n = n as usize;
    out[..8].fill(0);
    out[0..2].copy_from_slice(&((unmap_list_len(n) - 2) as u16).to_be_bytes());
    out[2..4].copy_from_slice(&((16 * n) as u16).to_be_bytes());
    let (mut at, mut left, mut next) = (8, blocks, lba);
    while left > 0 {
        let k = left.min(per);
        put64(out, at, next);
        put32(out, at + 8, k as u32);
        out[at + 12..at + 16].fill(0);
        next += k;
        left -= k;
        at += 16;
    }
    Some(at)
}

/// Standard INQUIRY data, as far as the initiator needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inquiry {
    /// PERIPHERAL QUALIFIER (0: a logical unit is connected).
    pub qualifier: u8,
    /// PERIPHERAL DEVICE TYPE (0: direct access block device).
    pub device_type: u8,
    /// T10 VENDOR IDENTIFICATION, trimmed.
    pub vendor: String,
    /// PRODUCT IDENTIFICATION, trimmed.
    pub product: String,
}

fn ascii(b: &[u8]) -> String {
    String::from_utf8_lossy(b).trim().to_string()
}

/// Parses standard INQUIRY data.
pub fn parse_inquiry(d: &[u8]) -> Option<Inquiry> {
    if d.len() < 5 {
        return None;
    }
    let field = |from: usize, to: usize| if d.len() >= to { ascii(&d[from..to]) } else { String::new() };
    Some(Inquiry { qualifier: d[0] >> 5, device_type: d[0] & 0x1f, vendor: field(8, 16), product: field(16, 32) })
}

/// The Block Limits VPD page (B0h), as far as the initiator needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BlockLimits {
    /// MAXIMUM TRANSFER LENGTH, blocks (0: none given).
    pub max_transfer: u32,
    /// OPTIMAL TRANSFER LENGTH, blocks (0: none given).
    pub optimal_transfer: u32,
    /// MAXIMUM UNMAP LBA COUNT (0: none given).
    pub max_unmap_lbas: u32,
    /// MAXIMUM UNMAP BLOCK DESCRIPTOR COUNT (0: none given).
    pub max_unmap_descriptors: u32,
    /// OPTIMAL UNMAP GRANULARITY, blocks.
    pub unmap_granularity: u32,
    /// UNMAP GRANULARITY ALIGNMENT, when valid.
    pub unmap_alignment: Option<u32>,
}

/// Parses the Block Limits VPD page.
pub fn parse_block_limits(d: &[u8]) -> Option<BlockLimits> {
    if d.len() < 16 || d[1] != 0xb0 {
        return None;
    }
    let word = |at: usize| if d.len() >= at + 4 { be32(d, at) } else { 0 };
    let align = word(32);
    Some(BlockLimits {
        max_transfer: word(8),
        optimal_transfer: word(12),
        max_unmap_lbas: word(20),
        max_unmap_descriptors: word(24),
        unmap_granularity: word(28),
        unmap_alignment: (align & 0x8000_0000 != 0).then_some(align & 0x7fff_ffff),
    })
}

/// Whether the Logical Block Provisioning VPD page (B2h) says UNMAP is supported (LBPU).
pub fn parse_lbpu(d: &[u8]) -> Option<bool> {
    if d.len() < 6 || d[1] != 0xb2 {
        return None;
    }
    Some(d[5] & 0x80 != 0)
}

/// READ CAPACITY data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// Blocks (the last LBA + 1).
    pub blocks: u64,
    /// Bytes per logical block.
    pub block_size: u32,
    /// Logical blocks per physical block, as an exponent of two.
    pub lbppbe: u8,
    /// Logical block provisioning management enabled (thin: UNMAP frees blocks).
    pub lbpme: bool,
}

/// Parses READ CAPACITY (16) data.
pub fn parse_capacity16(d: &[u8]) -> Option<Capacity> {
    if d.len() < 15 {
        return None;
    }
    Some(Capacity {
        blocks: be64(d, 0).checked_add(1)?,
        block_size: be32(d, 8),
        lbppbe: d[13] & 0x0f,
        lbpme: d[14] & 0x80 != 0,
    })
}

/// Parses READ CAPACITY (10) data; None also when the capacity does not fit (then READ
/// CAPACITY (16) must be used).
pub fn parse_capacity10(d: &[u8]) -> Option<Capacity> {
    if d.len() < 8 || be32(d, 0) == u32::MAX {
        return None;
    }
    Some(Capacity { blocks: u64::from(be32(d, 0)) + 1, block_size: be32(d, 4), lbppbe: 0, lbpme: false })
}

/// The WCE bit of MODE SENSE (10) data holding the caching page.
pub fn parse_wce(d: &[u8]) -> Option<bool> {
    if d.len() < 8 {
        return None;
    }
    let page = 8 + usize::from(be16(d, 6));
    let p = d.get(page..page + 3)?;
    (p[0] & 0x3f == 0x08).then_some(p[2] & 0x04 != 0)
}

/// Sense data's key and additional sense code (fixed or descriptor format).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sense {
    /// SENSE KEY.
    pub key: u8,
    /// ADDITIONAL SENSE CODE.
    pub asc: u8,
    /// ADDITIONAL SENSE CODE QUALIFIER.
    pub ascq: u8,
}

impl Sense {
    /// CAPACITY DATA HAS CHANGED (a unit attention).
    pub fn capacity_changed(&self) -> bool {
        self.key == key::UNIT_ATTENTION && self.asc == 0x2a && self.ascq == 0x09
    }
}

/// Parses sense data (without the 2-byte SenseLength of the iSCSI data segment).
pub fn parse_sense(s: &[u8]) -> Option<Sense> {
    match s.first()? & 0x7f {
        0x70 | 0x71 if s.len() >= 3 => Some(Sense {
            key: s[2] & 0x0f,
            asc: s.get(12).copied().unwrap_or(0),
            ascq: s.get(13).copied().unwrap_or(0),
        }),
        0x72 | 0x73 if s.len() >= 4 => Some(Sense { key: s[1] & 0x0f, asc: s[2], ascq: s[3] }),
        _ => None,
    }
}

/// The sense data in a SCSI Response's data segment (SenseLength, then the sense).
pub fn response_sense(data: &[u8]) -> Option<Sense> {
    if data.len() < 2 {
        return None;
    }
    let n = usize::from(be16(data, 0));
    parse_sense(data.get(2..2 + n)?)
}

/// What a command's end means for its bdev request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Done.
    Success,
    /// A unit attention (a reset, a new nexus, changed capacity): sent again.
    Retry,
    /// The target is busy or its task set full: the bdev layer tries again later.
    Busy,
    /// Failed with this status.
    Fail(IoStatus),
}

/// The verdict for SCSI `status` with `sense`.
pub fn verdict(st: u8, sense: Option<Sense>) -> Verdict {
    match st {
        status::GOOD | status::CONDITION_MET => Verdict::Success,
        status::BUSY | status::TASK_SET_FULL => Verdict::Busy,
        status::CHECK_CONDITION => match sense {
            Some(s) if s.key == key::UNIT_ATTENTION => Verdict::Retry,
            Some(s) => Verdict::Fail(IoStatus::Scsi { status: st, key: s.key, asc: s.asc, ascq: s.ascq }),
            None => Verdict::Fail(IoStatus::Scsi { status: st, key: 0, asc: 0, ascq: 0 }),
        },
        _ => Verdict::Fail(IoStatus::Scsi { status: st, key: 0, asc: 0, ascq: 0 }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cdbs_are_sbc_s() {
        let c = read16(0x0102_0304_0506_0708, 0x0a0b_0c0d);
        assert_eq!(c, [0x88, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0x0a, 0x0b, 0x0c, 0x0d, 0, 0]);
        let c = write16(5, 8, true);
        assert_eq!((c[0], c[1], c[9], c[13]), (0x8a, 0x08, 5, 8));
        assert_eq!(write16(5, 8, false)[1], 0);
        assert_eq!(synchronize_cache16()[0], 0x91);
        assert_eq!(read_capacity16()[..2], [0x9e, 0x10]);
        assert_eq!(read_capacity16()[13], 32);
        assert_eq!(inquiry(Some(0xb0), 255)[..5], [0x12, 1, 0xb0, 0, 255]);
        assert_eq!(inquiry(None, 96)[..5], [0x12, 0, 0, 0, 96]);
        assert_eq!(unmap(24)[..9], [0x42, 0, 0, 0, 0, 0, 0, 0, 24]);
        assert_eq!(mode_sense_caching(64)[..9], [0x5a, 0x08, 0x08, 0, 0, 0, 0, 0, 64]);
    }

    #[test]
    fn unmap_lists_split_at_the_lba_count() {
        let mut out = [0u8; 64];
        let n = unmap_list(100, 10, 4, 8, &mut out).unwrap();
        assert_eq!(n, 8 + 3 * 16);
        assert_eq!(be16(&out, 0), 6 + 48);
        assert_eq!(be16(&out, 2), 48);
        assert_eq!((be64(&out, 8), be32(&out, 16)), (100, 4));
        assert_eq!((be64(&out, 24), be32(&out, 32)), (104, 4));
        assert_eq!((be64(&out, 40), be32(&out, 48)), (108, 2));
        assert!(unmap_list(0, 10, 1, 8, &mut out).is_none(), "more descriptors than allowed");
        assert!(unmap_list(0, 0, 1, 8, &mut out).is_none());
    }

    #[test]
    fn data_in_pages_parse() {
        let mut inq = [0u8; 36];
        inq[0] = 0x00;
        inq[8..16].copy_from_slice(b"FERRITE ");
        inq[16..32].copy_from_slice(b"Ferrite disk    ");
        let i = parse_inquiry(&inq).unwrap();
        assert_eq!(
            (i.qualifier, i.device_type, i.vendor.as_str(), i.product.as_str()),
            (0, 0, "FERRITE", "Ferrite disk")
        );
        assert_eq!(parse_inquiry(&[0x7f, 0, 0, 0, 0]).unwrap().qualifier, 3);

        let mut b0 = [0u8; 64];
        b0[1] = 0xb0;
        b0[8..12].copy_from_slice(&2048u32.to_be_bytes());
        b0[20..24].copy_from_slice(&65536u32.to_be_bytes());
        b0[24..28].copy_from_slice(&16u32.to_be_bytes());
        b0[32..36].copy_from_slice(&0x8000_0002u32.to_be_bytes());
        let l = parse_block_limits(&b0).unwrap();
        assert_eq!(
            (l.max_transfer, l.max_unmap_lbas, l.max_unmap_descriptors, l.unmap_alignment),
            (2048, 65536, 16, Some(2))
        );
        assert!(parse_block_limits(&[0, 0xb2, 0, 0x3c]).is_none());

        assert_eq!(parse_lbpu(&[0, 0xb2, 0, 4, 0, 0x80, 2, 0]), Some(true));
        assert_eq!(parse_lbpu(&[0, 0xb2, 0, 4, 0, 0x40, 2, 0]), Some(false));

        let mut rc = [0u8; 32];
        rc[0..8].copy_from_slice(&999u64.to_be_bytes());
        rc[8..12].copy_from_slice(&4096u32.to_be_bytes());
        rc[13] = 3;
        rc[14] = 0xc0;
        assert_eq!(parse_capacity16(&rc), Some(Capacity { blocks: 1000, block_size: 4096, lbppbe: 3, lbpme: true }));
        let rc10 = [0, 0, 0x0f, 0xff, 0, 0, 2, 0];
        assert_eq!(parse_capacity10(&rc10).unwrap().blocks, 4096);
        assert!(parse_capacity10(&[0xff, 0xff, 0xff, 0xff, 0, 0, 2, 0]).is_none(), "too big for (10)");

        let mut ms = [0u8; 28];
        ms[8] = 0x08;
        ms[9] = 0x12;
        ms[10] = 0x04;
        assert_eq!(parse_wce(&ms), Some(true));
        ms[10] = 0;
        assert_eq!(parse_wce(&ms), Some(false));
    }

    #[test]
    fn sense_in_both_formats_and_verdicts() {
        let mut fixed = [0u8; 18];
        fixed[0] = 0x70;
        fixed[2] = 0x05;
        fixed[12] = 0x21;
        let s = parse_sense(&fixed).unwrap();
        assert_eq!(s, Sense { key: 5, asc: 0x21, ascq: 0 });
        let desc = [0x72, 0x06, 0x2a, 0x09, 0, 0, 0, 0];
        assert!(parse_sense(&desc).unwrap().capacity_changed());
        let mut seg = vec![0, 18];
        seg.extend_from_slice(&fixed);
        assert_eq!(response_sense(&seg), Some(s));
        assert_eq!(response_sense(&[0, 40, 0x70]), None, "SenseLength past the data");
        assert_eq!(verdict(status::GOOD, None), Verdict::Success);
        assert_eq!(verdict(status::CHECK_CONDITION, parse_sense(&desc)), Verdict::Retry);
        assert_eq!(
            verdict(status::CHECK_CONDITION, Some(s)),
            Verdict::Fail(IoStatus::Scsi { status: 2, key: 5, asc: 0x21, ascq: 0 })
        );
        assert_eq!(verdict(status::TASK_SET_FULL, None), Verdict::Busy);
        assert!(matches!(
            verdict(status::RESERVATION_CONFLICT, None),
            Verdict::Fail(IoStatus::Scsi { status: 0x18, .. })
        ));
    }
}
