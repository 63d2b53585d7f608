//! INQUIRY: the standard data and the vital product data pages (SPC-4 6.6, 7.8; SBC-3 6.6):
//! supported pages (00h), unit serial number (80h), device identification (83h: NAA and T10
//! vendor ID designators from the bdev's UUID, relative target port, target port group, the
//! target port's and target device's SCSI names), block limits (B0h, from the bdev's limits),
//! block device characteristics (B1h) and logical block provisioning (B2h, when the bdev
//! unmaps). Each function builds the whole page; the caller cuts it at the allocation length.

use crate::sense::Fault;

/// Peripheral device type: direct access block device.
pub const PDT_DISK: u8 = 0x00;

/// Who the logical unit says it is.
#[derive(Debug, Clone)]
pub struct Identity {
    /// T10 vendor identification (8 characters, space padded).
    pub vendor: [u8; 8],
    /// Product identification (16 characters).
    pub product: [u8; 16],
    /// Product revision level (4 characters).
    pub revision: [u8; 4],
    /// Unit serial number (ASCII).
    pub serial: String,
    /// The bdev's UUID, from which the NAA and T10 designators are made.
    pub uuid: [u8; 16],
}

/// `s` as a fixed field of printable ASCII, space padded (SPC-4 4.4.1).
pub fn ascii_field<const N: usize>(s: &str) -> [u8; N] {
    let mut f = [b' '; N];
    for (d, c) in f.iter_mut().zip(s.bytes().filter(|c| (0x20..0x7f).contains(c))) {
        *d = c;
    }
    f
}

/// The target port a command came through, as the transport names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortInfo {
    /// Relative target port identifier (1-65535).
    pub rel_id: u16,
    /// Target port group.
    pub group: u16,
    /// The port's SCSI name string (iSCSI: `iqn...,t,0x0001`).
    pub name: String,
    /// The transport's protocol identifier (SPC-4 7.6.1: iSCSI 5h, SAS 6h), shown with the
    /// target port designators; None: the designators carry no protocol (PIV 0).
    pub protocol: Option<u8>,
}

/// What the block pages show, from the bdev and the logical unit's configuration.
#[derive(Debug, Clone, Copy, Default)]
pub struct BlockFacts {
    /// Logical blocks per physical block, as a power of two.
    pub lbppbe: u8,
    /// Most blocks per READ or WRITE.
    pub max_transfer: u32,
    /// Optimal transfer length granularity, blocks.
    pub opt_granularity: u16,
    /// Optimal transfer length, blocks (0: not reported).
    pub opt_transfer: u32,
    /// Most blocks per COMPARE AND WRITE.
    pub max_compare_write: u8,
    /// UNMAP is served (LBPU, LBPWS, LBPWS10, LBPME).
    pub unmap: bool,
    /// Unmapped blocks read as zeroes (LBPRZ).
    pub lbprz: bool,
    /// Most blocks per UNMAP command.
    pub max_unmap_lba: u32,
    /// Most UNMAP block descriptors.
    pub max_unmap_descriptors: u32,
    /// Optimal unmap granularity, blocks (0: not reported).
    pub unmap_granularity: u32,
    /// The first block of the unmap granularity (reported with a granularity).
    pub unmap_alignment: u32,
    /// Most blocks per WRITE SAME.
    pub max_write_same: u64,
}

/// Standard INQUIRY data (96 bytes, SPC-4).
pub fn standard(id: &Identity, tpgs: bool) -> Vec<u8> {
    let mut d = vec![0u8; 96];
    d[0] = PDT_DISK;
    d[2] = 0x06; // SPC-4
    d[3] = 0x10 | 0x02; // HISUP, response data format 2
    d[4] = (96 - 5) as u8;
    d[5] = if tpgs { 0x10 } else { 0 }; // TPGS 01b: implicit asymmetric access
    d[6] = 0x10; // MULTIP
    d[7] = 0x02; // CMDQUE
    d[8..16].copy_from_slice(&id.vendor);
    d[16..32].copy_from_slice(&id.product);
    d[32..36].copy_from_slice(&id.revision);
    // Version descriptors: SAM-5, SPC-4, SBC-3.
    for (i, v) in [0x00a0u16, 0x0460, 0x04c0].iter().enumerate() {
        d[58 + 2 * i..60 + 2 * i].copy_from_slice(&v.to_be_bytes());
    }
    d
}

/// The VPD pages served, in order (B2h only when the bdev unmaps).
pub fn supported_pages(unmap: bool) -> &'static [u8] {
    if unmap {
        &[0x00, 0x80, 0x83, 0xb0, 0xb1, 0xb2]
    } else {
        &[0x00, 0x80, 0x83, 0xb0, 0xb1]
    }
}

fn vpd(page: u8, body: &[u8]) -> Vec<u8> {
    let mut d = Vec::with_capacity(4 + body.len());
    d.extend_from_slice(&[PDT_DISK, page]);
    d.extend_from_slice(&(body.len() as u16).to_be_bytes());
    d.extend_from_slice(body);
    d
}

/// Designator (SPC-4 7.8.6.1): code set, association, type, PIV with the protocol.
fn designator(out: &mut Vec<u8>, protocol: Option<u8>, code_set: u8, assoc: u8, kind: u8, value: &[u8]) {
    let (proto, piv) = match protocol {
        Some(p) if assoc != 0 => (p << 4, 0x80),
        _ => (0, 0),
    };
    out.extend_from_slice(&[proto | code_set, piv | assoc << 4 | kind, 0, value.len() as u8]);
    out.extend_from_slice(value);
}

/// A SCSI name string: UTF-8, NUL terminated, padded to a multiple of four.
fn scsi_name(s: &str) -> Vec<u8> {
    let mut v: Vec<u8> = s.bytes().take(251).collect();
    v.push(0);
    while !v.len().is_multiple_of(4) {
        v.push(0);
    }
    v
}

/// The logical unit's NAA designator: NAA 3 (locally assigned), 60 bits folded from the UUID.
pub fn naa(uuid: &[u8; 16]) -> [u8; 8] {
    let hi = u64::from_be_bytes(uuid[..8].try_into().expect("8 bytes"));
    let lo = u64::from_be_bytes(uuid[8..].try_into().expect("8 bytes"));
    ((3u64 << 60) | ((hi ^ lo.rotate_left(17)) & ((1 << 60) - 1))).to_be_bytes()
}

/// A VPD page, or INVALID FIELD IN CDB (pointing at the page code) for one not served.
pub fn vpd_page(page: u8, id: &Identity, port: &PortInfo, target_name: &str, b: &BlockFacts) -> Result<Vec<u8>, Fault> {
    Ok(match page {
        0x00 => vpd(0x00, supported_pages(b.unmap)),
        0x80 => vpd(0x80, id.serial.as_bytes()),
        0x83 => {
            let mut body = Vec::new();
            designator(&mut body, None, 1, 0, 3, &naa(&id.uuid));
            let mut t10 = id.vendor.to_vec();
            for x in id.uuid {
                t10.extend_from_slice(format!("{x:02x}").as_bytes());
            }
            designator(&mut body, None, 2, 0, 1, &t10);
            let mut rel = [0u8; 4];
            rel[2..].copy_from_slice(&port.rel_id.to_be_bytes());
            designator(&mut body, port.protocol, 1, 1, 4, &rel);
            let mut tpg = [0u8; 4];
            tpg[2..].copy_from_slice(&port.group.to_be_bytes());
            designator(&mut body, port.protocol, 1, 1, 5, &tpg);
            if !port.name.is_empty() {
                designator(&mut body, port.protocol, 3, 1, 8, &scsi_name(&port.name));
            }
            if !target_name.is_empty() {
                designator(&mut body, port.protocol, 3, 2, 8, &scsi_name(target_name));
            }
            vpd(0x83, &body)
        }
        0xb0 => {
            let mut p = vec![0u8; 0x3c];
            let o = |i: usize| i - 4;
            p[o(4)] = 0x01; // WSNZ
            p[o(5)] = b.max_compare_write;
            p[o(6)..o(8)].copy_from_slice(&b.opt_granularity.to_be_bytes());
            p[o(8)..o(12)].copy_from_slice(&b.max_transfer.to_be_bytes());
            p[o(12)..o(16)].copy_from_slice(&b.opt_transfer.to_be_bytes());
            p[o(16)..o(20)].copy_from_slice(&b.max_transfer.to_be_bytes());
            if b.unmap {
                p[o(20)..o(24)].copy_from_slice(&b.max_unmap_lba.to_be_bytes());
                p[o(24)..o(28)].copy_from_slice(&b.max_unmap_descriptors.to_be_bytes());
                if b.unmap_granularity > 0 {
                    p[o(28)..o(32)].copy_from_slice(&b.unmap_granularity.to_be_bytes());
                    let ugavalid = 0x8000_0000 | (b.unmap_alignment & 0x7fff_ffff);
                    p[o(32)..o(36)].copy_from_slice(&ugavalid.to_be_bytes());
                }
            }
            p[o(36)..o(44)].copy_from_slice(&b.max_write_same.to_be_bytes());
            vpd(0xb0, &p)
        }
        0xb1 => {
            let mut p = vec![0u8; 0x3c];
            p[1] = 1; // MEDIUM ROTATION RATE: non-rotating medium
            vpd(0xb1, &p)
        }
        0xb2 if b.unmap => {
            // LBPU, LBPWS, LBPWS10, LBPRZ, ANC_SUP; thin provisioned.
            let lbprz = if b.lbprz { 0x04 } else { 0 };
            vpd(0xb2, &[0, 0xe0 | lbprz | 0x02, 0x02, 0])
        }
        _ => return Err(Fault::invalid_cdb(2, Some(7))),
    })
}

/// READ CAPACITY(10) data: the last LBA (FFFFFFFFh beyond 32 bits) and the block size.
pub fn capacity10(num_blocks: u64, block_size: u32) -> Vec<u8> {
    let last = u32::try_from(num_blocks.saturating_sub(1)).unwrap_or(u32::MAX);
    let mut d = last.to_be_bytes().to_vec();
    d.extend_from_slice(&block_size.to_be_bytes());
    d
}

/// READ CAPACITY(16) data (32 bytes): last LBA, block size, the physical block exponent, LBPME
/// and LBPRZ.
pub fn capacity16(num_blocks: u64, block_size: u32, b: &BlockFacts) -> Vec<u8> {
    let mut d = vec![0u8; 32];
    d[0..8].copy_from_slice(&num_blocks.saturating_sub(1).to_be_bytes());
    d[8..12].copy_from_slice(&block_size.to_be_bytes());
    d[13] = b.lbppbe & 0x0f;
    if b.unmap {
        d[14] = 0x80 | if b.lbprz { 0x40 } else { 0 };
    }
    d
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id() -> Identity {
        Identity {
            vendor: ascii_field("FERRITE"),
            product: ascii_field("Malloc disk"),
            revision: ascii_field("0001"),
            serial: "Malloc0".into(),
            uuid: [0x11; 16],
        }
    }

    fn port() -> PortInfo {
        PortInfo { rel_id: 1, group: 1, name: "iqn.x,t,0x0001".into(), protocol: Some(5) }
    }

    #[test]
    fn standard_data() {
        let d = standard(&id(), true);
        assert_eq!((d.len(), d[2], d[3] & 0x0f, usize::from(d[4]) + 5), (96, 6, 2, 96));
        assert_eq!(&d[8..16], b"FERRITE ");
        assert_eq!(d[5] & 0x30, 0x10);
    }

    #[test]
    fn device_identification_lengths_add_up() {
        let b = BlockFacts::default();
        let p = vpd_page(0x83, &id(), &port(), "iqn.target", &b).unwrap();
        let len = usize::from(u16::from_be_bytes([p[2], p[3]]));
        assert_eq!(p.len(), 4 + len);
        let mut at = 4;
        let mut kinds = vec![];
        while at < p.len() {
            kinds.push((p[at + 1] >> 4 & 3, p[at + 1] & 0x0f));
            at += 4 + usize::from(p[at + 3]);
        }
        assert_eq!(at, p.len());
        assert_eq!(kinds, vec![(0, 3), (0, 1), (1, 4), (1, 5), (1, 8), (2, 8)]);
        assert_eq!(p[4 + 4] >> 4, 3, "NAA 3");
    }

    #[test]
    fn unknown_pages_are_invalid_fields() {
        let b = BlockFacts::default();
        assert_eq!(vpd_page(0xb2, &id(), &port(), "", &b).unwrap_err().field.map(|f| f.byte), Some(2));
        assert!(vpd_page(0xc0, &id(), &port(), "", &b).is_err());
        let b = BlockFacts { unmap: true, lbprz: true, ..Default::default() };
        assert_eq!(vpd_page(0xb2, &id(), &port(), "", &b).unwrap()[5], 0xe6);
    }

    #[test]
    fn capacities() {
        assert_eq!(capacity10(1 << 33, 512)[..4], [0xff; 4]);
        let b = BlockFacts { lbppbe: 3, unmap: true, lbprz: true, ..Default::default() };
        let d = capacity16(100, 512, &b);
        assert_eq!((d[7], d[13], d[14]), (99, 3, 0xc0));
    }
}
