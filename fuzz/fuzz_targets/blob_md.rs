//! Fuzzes the blobstore on-disk format codec and the offline checker (crates/blob). The first
//! byte picks a mode, the rest is its input:
//!
//! - 0: a super block page, then 8 bytes of device size: decode, geometry; what decodes must
//!   encode back to a page that decodes the same;
//! - 1: a metadata page, as is: descriptor area, chain parse, extent page decode; a blob that
//!   parses must serialize, and what that serializes to must parse back to a fixed point;
//! - 2: the same with the page's CRC recomputed, so that the descriptors are always reached;
//! - 3: a mask region, the next byte choosing the mask kind: what decodes must re-encode and
//!   decode the same;
//! - 4: a whole image, as records `page: u16, start: u16, len: u16, bytes` over a sparse
//!   device whose size the super block gives (at most 64 MiB): open, check, dump, rebuilt masks;
//! - 5: the same with the CRC of the super block and of every page outside the masks
//!   recomputed.
//!
//! Nothing may panic or allocate without bound: every count is capped by the device size or the
//! checker's cluster budget. Seeds (fuzz/seeds/blob_md) are the SPDK fixtures of
//! crates/blob/tests/fixtures cut into these modes: every super block, md page and mask, and
//! each whole image.

#![no_main]

use ferrite_blob::format::blob::{link_chain, ExtentPage, ParseLimits};
use ferrite_blob::format::{descriptor, BlobMd, MaskKind, MdMask, MdPage, SuperBlock, PAGE_SIZE};
use ferrite_blob::offline::{self, ReadAt};
use libfuzzer_sys::fuzz_target;
use std::collections::BTreeMap;

const LIMITS: ParseLimits = ParseLimits { max_clusters: 1 << 16 };
const MAX_DEVICE: u64 = 64 << 20;

/// The first 4096 bytes of `data`, zero-padded, and the rest.
fn page_of(data: &[u8]) -> ([u8; PAGE_SIZE], &[u8]) {
    let mut b = [0u8; PAGE_SIZE];
    let n = data.len().min(PAGE_SIZE);
    b[..n].copy_from_slice(&data[..n]);
    (b, &data[n..])
}

fn seal(page: &mut [u8]) {
    let crc = crc32c::crc32c(&page[..PAGE_SIZE - 4]);
    page[PAGE_SIZE - 4..PAGE_SIZE].copy_from_slice(&crc.to_le_bytes());
}

fn super_block(data: &[u8]) {
    let (b, rest) = page_of(data);
    let mut size = [0u8; 8];
    let n = rest.len().min(8);
    size[..n].copy_from_slice(&rest[..n]);
    if let Ok(sb) = SuperBlock::decode(&b) {
        let again = SuperBlock::decode(&sb.encode()).expect("an encoded super block decodes");
        assert_eq!(again, sb);
        if let Ok(g) = sb.geometry(u64::from_le_bytes(size)) {
            assert!(g.md_clusters <= g.total_clusters);
            assert!(u64::from(g.md_start) + u64::from(g.md_len) <= g.size / u64::from(g.md_page_size));
        }
    }
}

/// Serializes a parsed blob and parses the result back.
fn reparse(md: &BlobMd) -> BlobMd {
    let mut pages = md.serialize().expect("a parsed blob serializes");
    let rest: Vec<u32> = (1..pages.len() as u32).collect();
    link_chain(&mut pages, &rest).expect("chain links");
    let decoded: Vec<MdPage> =
        pages.iter().map(|p| MdPage::decode_checked(&p.encode()).expect("serialized page decodes")).collect();
    BlobMd::parse_chain(&decoded, &LIMITS).expect("serialized blob parses")
}

fn md_page(data: &[u8], reseal: bool) {
    let (mut b, _) = page_of(data);
    if reseal {
        seal(&mut b);
    }
    let Ok(page) = MdPage::decode(&b) else { return };
    assert_eq!(page.to_bytes_raw(), b);
    let _ = descriptor::parse_area(&page.descriptors[..]);
    if let Ok(ep) = ExtentPage::from_page(&page) {
        if let Ok(p) = ep.to_page() {
            assert_eq!(ExtentPage::from_page(&p).expect("encoded extent page decodes"), ep);
        }
    }
    let Ok(mut md) = BlobMd::parse_chain(std::slice::from_ref(&page), &LIMITS) else { return };
    let once = reparse(&md);
    let twice = reparse(&once);
    assert_eq!(once, twice, "serialization reaches a fixed point");
    assert_eq!(once.clusters, md.clusters);
    assert_eq!(once.num_clusters, md.num_clusters);
    assert_eq!((&once.xattrs, &once.internal_xattrs), (&md.xattrs, &md.internal_xattrs));
    if let Some(n) = md.extent_table.as_ref().map(Vec::len) {
        if md.extent_table.as_ref().is_some_and(|t| t.iter().all(|&p| p == 0)) {
            let _ = md.load_extent_pages(&vec![None; n]);
        }
    }
}

fn mask(data: &[u8]) {
    let Some((&k, region)) = data.split_first() else { return };
    let kind = [MaskKind::UsedPages, MaskKind::UsedClusters, MaskKind::UsedBlobIds][usize::from(k % 3)];
    if let Ok(m) = MdMask::decode(region, kind) {
        let back = MdMask::decode(&m.encode(region.len()).expect("fits its region"), kind).expect("decodes");
        assert_eq!(back, m);
        assert!(m.count_ones() <= u64::from(m.len()));
    }
}

/// A device of `size` bytes, zero but for some pages.
struct Sparse {
    size: u64,
    pages: BTreeMap<u64, [u8; PAGE_SIZE]>,
}

impl ReadAt for Sparse {
    fn size(&self) -> std::io::Result<u64> {
        Ok(self.size)
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        let end = offset.checked_add(buf.len() as u64).filter(|&e| e <= self.size);
        if end.is_none() {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "past the end"));
        }
        buf.fill(0);
        let first = offset / PAGE_SIZE as u64;
        let last = (offset + buf.len() as u64).div_ceil(PAGE_SIZE as u64);
        for (&p, page) in self.pages.range(first..last) {
            let page_start = p * PAGE_SIZE as u64;
            let from = offset.max(page_start);
            let to = (offset + buf.len() as u64).min(page_start + PAGE_SIZE as u64);
            buf[(from - offset) as usize..(to - offset) as usize]
                .copy_from_slice(&page[(from - page_start) as usize..(to - page_start) as usize]);
        }
        Ok(())
    }
}

fn image(mut data: &[u8], reseal: bool) {
    let mut pages: BTreeMap<u64, [u8; PAGE_SIZE]> = BTreeMap::new();
    while data.len() >= 6 {
        let page = u64::from(u16::from_le_bytes([data[0], data[1]]));
        let start = usize::from(u16::from_le_bytes([data[2], data[3]])) % PAGE_SIZE;
        let len = usize::from(u16::from_le_bytes([data[4], data[5]])).min(PAGE_SIZE - start);
        data = &data[6..];
        let len = len.min(data.len());
        let p = pages.entry(page).or_insert([0u8; PAGE_SIZE]);
        p[start..start + len].copy_from_slice(&data[..len]);
        data = &data[len..];
    }
    let mut masks = Vec::new();
    if let Some(sb) = pages.get_mut(&0) {
        if reseal {
            seal(sb);
        }
        if let Ok(s) = SuperBlock::decode(sb) {
            for (start, len) in [
                (s.used_page_mask_start, s.used_page_mask_len),
                (s.used_cluster_mask_start, s.used_cluster_mask_len),
                (s.used_blobid_mask_start, s.used_blobid_mask_len),
            ] {
                masks.push(u64::from(start)..u64::from(start) + u64::from(len));
            }
        }
    }
    if reseal {
        for (&p, page) in pages.iter_mut() {
            if p != 0 && !masks.iter().any(|m| m.contains(&p)) {
                seal(page);
            }
        }
    }
    let size = pages
        .get(&0)
        .and_then(|p| SuperBlock::decode(p).ok())
        .map(|s| s.size)
        .filter(|&s| s >= PAGE_SIZE as u64 && s <= MAX_DEVICE)
        .unwrap_or(64 * PAGE_SIZE as u64);
    let dev = Sparse { size, pages };
    if let Ok(img) = offline::open(&dev, &offline::OpenOptions { max_total_clusters: 1 << 16 }) {
        let report = offline::check(&img);
        assert_eq!(report.blobs, img.blobs.len());
        let _ = offline::dump(&img);
        let rebuilt = offline::rebuilt_masks(&img);
        assert_eq!(u64::from(rebuilt.used_pages.len()), u64::from(img.geometry.md_len));
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    match mode % 6 {
        0 => super_block(rest),
        1 => md_page(rest, false),
        2 => md_page(rest, true),
        3 => mask(rest),
        4 => image(rest, false),
        _ => image(rest, true),
    }
});
