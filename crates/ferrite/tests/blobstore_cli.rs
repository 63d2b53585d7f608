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

/// Rewrites the super block with `edit` applied (the CRC recomputed by the encoder).
fn edit_super(path: &Path, edit: impl FnOnce(&mut SuperBlock)) -> SuperBlock {
    let mut sb = SuperBlock::decode(&read_page(path, 0)).unwrap();
    edit(&mut sb);
    write_page(path, 0, &sb.encode());
    sb
}

#[test]
fn check_a_grow_cut_short_is_what_the_load_repairs() {
    let dir = TempDir::new("blobgrow");
    let img = image_file(&dir, "lvs_1m");
    // What a live grow (SPDK's spdk_bs_grow_live, Ferrite's Blobstore::grow) leaves when killed
    // before the next unload: the device larger, the super block with its size and not clean,
    // the cluster mask still of the old length.
    let old = SuperBlock::decode(&read_page(&img, 0)).unwrap();
    let old_clusters = old.size / u64::from(old.cluster_size);
    let new_size = old.size + 16 * u64::from(old.cluster_size);
    std::fs::OpenOptions::new().write(true).open(&img).unwrap().set_len(new_size).unwrap();
    edit_super(&img, |sb| {
        sb.size = new_size;
        sb.clean = 0;
    });
    let (code, out, err) = blobstore("check", &img);
    assert_eq!(code, 3, "stdout {out} stderr {err}");
    let covers = format!(
        "problem: used cluster mask covers {old_clusters} of {} clusters (a grow cut short)",
        old_clusters + 16
    );
    assert!(out.contains(&covers), "{out}");
    assert!(out.contains("2 problems found, all of them what the next load repairs"), "{out}");
    // No writer leaves it clean, but loads take that too (SPDK uses the clusters past the mask
    // after its next unload writes the whole mask, Ferrite at once): 3, not 1.
    edit_super(&img, |sb| sb.clean = 1);
    let (code, out, _) = blobstore("check", &img);
    assert_eq!(code, 3, "{out}");
    assert!(out.contains(&covers), "{out}");
    assert!(
        out.contains("1 problems found, all of them what the store loads with and its next unload repairs"),
        "{out}"
    );
    // A blob mapping a cluster past the short mask of a clean store is damage (the load would
    // hand the cluster out again): 1.
    let dev_page = MD_START + 10;
    let page = MdPage::decode_checked(&read_page(&img, dev_page)).unwrap();
    let mut ep = ferrite_blob::format::ExtentPage::from_page(&page).unwrap();
    ep.clusters[2] = (old_clusters + 3) as u32;
    write_page(&img, dev_page, &ep.to_page().unwrap().encode());
    let (code, out, _) = blobstore("check", &img);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&format!("cluster {} of blob 0x100000009 is not marked", old_clusters + 3)), "{out}");
}

#[test]
fn check_reports_a_super_blob_no_lvstore_loads_from() {
    let dir = TempDir::new("blobsuper");
    let img = image_file(&dir, "lvs_1m");
    // None set: SPDK's lvs_open_super finds nothing (spdk_bs_get_super: -ENOENT).
    edit_super(&img, |sb| sb.super_blob = ferrite_blob::format::BLOBID_INVALID);
    let (code, out, _) = blobstore("check", &img);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("problem: super block names no super blob (0xffffffffffffffff): no lvstore loads from it"),
        "{out}"
    );
    assert!(out.contains("1 problems found"), "{out}");
    // An id whose md page holds no blob (page 10 is the clone's extent page).
    edit_super(&img, |sb| sb.super_blob = 0x1_0000_000a);
    let (code, out, _) = blobstore("check", &img);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("problem: super blob 0x10000000a is not a blob of this store: no lvstore loads from it"),
        "{out}"
    );
    // After a crash too: no load repairs it.
    mark_dirty(&img);
    let (code, out, _) = blobstore("check", &img);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("super blob 0x10000000a is not a blob of this store"), "{out}");
}

#[test]
fn check_reports_an_io_unit_size_no_device_has() {
    let dir = TempDir::new("blobiou");
    let img = image_file(&dir, "lvs_1m");
    for bad in [1u32, 256] {
        edit_super(&img, |sb| sb.io_unit_size = bad);
        let (code, out, err) = blobstore("check", &img);
        assert_eq!(code, 1, "io_unit_size {bad}: stdout {out} stderr {err}");
        assert!(
            out.contains(&format!("problem: io_unit_size {bad} is not a device block size (512 bytes or more)")),
            "{out}"
        );
    }
    // 0 means 4096 (old images), 512 and 4096 are block sizes.
    for good in [0u32, 512, 4096] {
        edit_super(&img, |sb| sb.io_unit_size = good);
        let (code, out, _) = blobstore("check", &img);
        assert_eq!(code, 0, "io_unit_size {good}: {out}");
    }
}
