//! Loads the SPDK fixtures of tests/fixtures (written by make_spdk_lvstore.sh): the metadata
//! pages of an image, stored as non-zero runs, and the JSON of what SPDK reported.
#![allow(dead_code)]

use std::path::PathBuf;

/// The fixtures directory.
pub fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// The metadata pages of a fixture image.
pub struct Pages {
    /// md page size the pages were cut at.
    pub page_size: usize,
    /// Size of the image SPDK ran on.
    pub device_size: u64,
    /// (byte offset, page bytes) of every non-zero page.
    pub pages: Vec<(u64, Vec<u8>)>,
}

fn take<'a>(b: &mut &'a [u8], n: usize) -> &'a [u8] {
    assert!(b.len() >= n, "fixture truncated");
    let (head, tail) = b.split_at(n);
    *b = tail;
    head
}

fn u16_(b: &mut &[u8]) -> u16 {
    u16::from_le_bytes(take(b, 2).try_into().unwrap())
}

fn u32_(b: &mut &[u8]) -> u32 {
    u32::from_le_bytes(take(b, 4).try_into().unwrap())
}

fn u64_(b: &mut &[u8]) -> u64 {
    u64::from_le_bytes(take(b, 8).try_into().unwrap())
}

/// Reads NAME.pages.
pub fn load_pages(name: &str) -> Pages {
    load_pages_from(&fixtures_dir(), name)
}

/// Reads NAME.pages from `dir` (for users outside this crate).
pub fn load_pages_from(dir: &std::path::Path, name: &str) -> Pages {
    let data = std::fs::read(dir.join(format!("{name}.pages"))).unwrap();
    let mut b = data.as_slice();
    assert_eq!(take(&mut b, 8), b"FBLOBPG1");
    let page_size = u32_(&mut b) as usize;
    let device_size = u64_(&mut b);
    let mut pages = Vec::new();
    while !b.is_empty() {
        let off = u64_(&mut b);
        let runs = u16_(&mut b);
        let mut page = vec![0u8; page_size];
        for _ in 0..runs {
            let start = u16_(&mut b) as usize;
            let len = u16_(&mut b) as usize;
            page[start..start + len].copy_from_slice(take(&mut b, len));
        }
        pages.push((off, page));
    }
    Pages { page_size, device_size, pages }
}

/// The fixture as a whole in-memory image (zeros but for the metadata pages).
pub fn image(name: &str) -> Vec<u8> {
    let p = load_pages(name);
    let mut img = vec![0u8; p.device_size as usize];
    for (off, page) in &p.pages {
        img[*off as usize..*off as usize + page.len()].copy_from_slice(page);
    }
    img
}

/// NAME.json.
pub fn load_json(name: &str) -> serde_json::Value {
    let text = std::fs::read_to_string(fixtures_dir().join(format!("{name}.json"))).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Opens and claims bdev `name` as a blobstore's device (the simulation tests' crash disks).
pub fn open_dev(name: &str) -> ferrite_blob::store::Dev {
    let desc = ferrite_bdev::Bdev::open_ext(name, true, |_| {}).expect("open the disk");
    desc.claim("blobstore").expect("claim the disk");
    ferrite_blob::store::Dev::new(desc)
}

/// Checks an image with the offline checker (what `ferrite blobstore check` runs): a
/// blobstore in use (loaded, not unloaded) is not clean; nothing else may be wrong.
pub fn check_image(img: &[u8], what: &str) -> ferrite_blob::offline::Image {
    use ferrite_blob::offline;
    let image = offline::open(img, &offline::OpenOptions::default()).unwrap_or_else(|e| panic!("{what}: {e:?}"));
    let report = offline::check(&image);
    let problems: Vec<_> = report.problems.iter().filter(|p| !matches!(p, offline::Problem::NotClean)).collect();
    assert!(problems.is_empty(), "{what}: the checker found problems: {problems:?}");
    image
}
