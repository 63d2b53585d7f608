//! `ferrite blobstore dump|check` on an lvstore image SPDK v26.05 wrote (rebuilt from the
//! ferrite-blob fixtures into a sparse file), and on copies corrupted on purpose.

#[path = "../../blob/tests/common/mod.rs"]
mod blob_fixtures;
mod common;

use common::{run_ferrite, TempDir};
use ferrite_blob::format::{MaskKind, MdMask, MdPage, SuperBlock, PAGE_SIZE};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Output;

/// Writes the fixture's metadata pages into a sparse file of the original device size.
fn image_file(dir: &TempDir, fixture: &str) -> PathBuf {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../blob/tests/fixtures");
    let pages = blob_fixtures::load_pages_from(&fixtures, fixture);
    let path = dir.join(&format!("{fixture}.img"));
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(pages.device_size).unwrap();
    for (off, page) in &pages.pages {
        f.write_all_at(page, *off).unwrap();
    }
    path
}

fn read_page(path: &Path, page: u64) -> Vec<u8> {
    let f = std::fs::File::open(path).unwrap();
    let mut b = vec![0u8; PAGE_SIZE];
    f.read_exact_at(&mut b, page * PAGE_SIZE as u64).unwrap();
    b
}

fn write_page(path: &Path, page: u64, bytes: &[u8]) {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(bytes, page * PAGE_SIZE as u64).unwrap();
}

/// Clears the super block's clean flag, as a crash leaves it.
fn mark_dirty(path: &Path) {
    let mut sb = SuperBlock::decode(&read_page(path, 0)).unwrap();
    sb.clean = 0;
    write_page(path, 0, &sb.encode());
}

fn blobstore(cmd: &str, path: &Path) -> (i32, String, String) {
    let out: Output = run_ferrite(&["blobstore", cmd, path.to_str().unwrap()]);
    let code = out.status.code().expect("exit status");
    (code, String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

// Layout of the lvs_1m fixture (see crates/blob/tests/spdk_fixtures.rs): md region from device
// page 4; used cluster mask at device page 2; lvol "resized" is blob 0x100000004 with clusters
// 3, 6, 7; lvol "clone" is blob 0x100000009, its extent page at md page 10 maps its cluster 2 to
// device cluster 8.
const MD_START: u64 = 4;
const CLUSTER_MASK_PAGE: u64 = 2;

#[test]
fn check_and_dump_spdk_image() {
    let dir = TempDir::new("blobcli");
    let img = image_file(&dir, "lvs_1m");
    let (code, out, err) = blobstore("check", &img);
    assert_eq!(code, 0, "stdout {out} stderr {err}");
    assert!(out.contains("7 blobs, 12 md pages and 9 clusters in use, clean"), "{out}");
    assert!(out.contains("no problems found"), "{out}");

    let (code, out, _) = blobstore("dump", &img);
    assert_eq!(code, 0);
    assert!(out.contains("bstype \"LVOLSTORE\""), "{out}");
    assert!(out.contains("xattr name = \"lvs0\""), "{out}");
    assert!(out.contains("xattr name = \"clone\" (64 bytes)"), "{out}");
    assert!(out.contains("xattr name = \"renamed\" (8 bytes)"), "{out}");
    assert!(out.contains("parent snapshot 0x100000008"), "{out}");
    assert!(out.contains("internal xattr SNAP = 0x100000008 (u64)"), "{out}");
    assert!(out.contains("[thin extent-table read-only]"), "{out}");
}

#[test]
fn check_reports_a_cleared_mask_bit() {
    let dir = TempDir::new("blobmask");
    let img = image_file(&dir, "lvs_1m");
    let mut mask = MdMask::decode(&read_page(&img, CLUSTER_MASK_PAGE), MaskKind::UsedClusters).unwrap();
    assert!(mask.get(3));
    mask.set(3, false);
    write_page(&img, CLUSTER_MASK_PAGE, &mask.encode(PAGE_SIZE).unwrap());
    let (code, out, _) = blobstore("check", &img);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("problem: cluster 3 of blob 0x100000004 is not marked in the used cluster mask"), "{out}");
    assert!(out.contains("1 problems found"), "{out}");
    // The same mask on an image that was not unloaded cleanly: its next load rebuilds the
    // masks, so only that is wrong, and the exit status says so (3).
    mark_dirty(&img);
    let (code, out, _) = blobstore("check", &img);
    assert_eq!(code, 3, "{out}");
    assert!(out.contains("not clean"), "{out}");
    assert!(out.contains("2 problems found, all of them what the next load repairs"), "{out}");
}

#[test]
fn check_reports_a_double_allocated_cluster() {
    let dir = TempDir::new("blobdouble");
    let img = image_file(&dir, "lvs_1m");
    // Point the clone's cluster 2 at device cluster 3, which "resized" owns, and reseal the page.
    let dev_page = MD_START + 10;
    let mut page = MdPage::decode_checked(&read_page(&img, dev_page)).unwrap();
    let mut ep = ferrite_blob::format::ExtentPage::from_page(&page).unwrap();
    assert_eq!(ep.clusters, vec![0, 0, 8, 0]);
    ep.clusters[2] = 3;
    page = ep.to_page().unwrap();
    write_page(&img, dev_page, &page.encode());
    let (code, out, _) = blobstore("check", &img);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("problem: cluster 3 is mapped by blob 0x100000004 and by blob 0x100000009"), "{out}");
    // Its own cluster is now leaked.
    assert!(out.contains("problem: cluster 8 is marked used but no blob maps it"), "{out}");
    assert!(out.contains("2 problems found"), "{out}");
    // A cluster used twice is damage no load repairs, dirty or not.
    mark_dirty(&img);
    let (code, out, _) = blobstore("check", &img);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("is mapped by blob 0x100000004 and by blob 0x100000009"), "{out}");
}

#[test]
fn check_reports_a_bad_crc_and_unreadable_images() {
    let dir = TempDir::new("blobcrc");
    let img = image_file(&dir, "lvs_1m");
    let mut b = read_page(&img, MD_START + 9);
    b[40] ^= 1;
    write_page(&img, MD_START + 9, &b);
    let (code, out, _) = blobstore("check", &img);
    assert_eq!(code, 1, "{out}");
    // Page 9 is the root of "clone": the blob is gone as far as a reader can tell, so its id,
    // its extent page and its cluster are reported as marked for nothing.
    assert!(out.contains("problem: md page 9 is marked used but fails its crc"), "{out}");
    assert!(out.contains("problem: blob id mask marks md page 9, which starts no blob"), "{out}");
    assert!(out.contains("problem: cluster 8 is marked used but no blob maps it"), "{out}");

    let junk = dir.file_filled("junk.img", 1 << 20, 0xab);
    let (code, _, err) = blobstore("check", &junk);
    assert_eq!(code, 2);
    assert!(err.contains("not a blobstore"), "{err}");
    let (code, _, err) = blobstore("dump", &dir.join("missing.img"));
    assert_eq!(code, 2);
    assert!(err.contains("missing.img"), "{err}");
}
