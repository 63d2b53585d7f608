//! Test vectors from SPDK v26.05 itself (tests/fixtures, made by make_spdk_lvstore.sh): the
//! metadata of lvstores SPDK built, decoded and checked against what SPDK's RPCs reported, and
//! every blob re-serialized and compared byte for byte with SPDK's pages.

mod common;

use ferrite_blob::format::blob::{link_chain, Parent};
use ferrite_blob::format::units::{blobid_to_page, page_to_blobid};
use ferrite_blob::format::{BlobMd, MdPage, SuperBlock, PAGE_SIZE};
use ferrite_blob::offline::{self, Image, Problem};
use ferrite_lvol::xattr::LvolNames;
use serde_json::Value;
use std::collections::BTreeSet;

const CLEAN_IMAGES: [&str; 3] = ["lvs_1m", "lvs_4m", "recovered_1m"];

fn open(name: &str) -> (Vec<u8>, Image) {
    let bytes = common::image(name);
    let img = offline::open(&bytes, &offline::OpenOptions::default()).unwrap();
    (bytes, img)
}

fn md(img: &Image, id: u64) -> &BlobMd {
    img.blob(id).unwrap().md.as_ref().unwrap()
}

/// The blob of the lvol with this uuid.
fn lvol_by_uuid<'a>(img: &'a Image, uuid: &str) -> &'a BlobMd {
    let found: Vec<&BlobMd> = img
        .blobs
        .iter()
        .filter_map(|b| b.md.as_ref().ok())
        .filter(|md| LvolNames::of(md).uuid.as_deref() == Some(uuid))
        .collect();
    assert_eq!(found.len(), 1, "blobs with uuid {uuid}");
    found[0]
}

#[test]
fn super_blocks_match_what_spdk_reported() {
    for name in CLEAN_IMAGES.iter().chain(["dirty_1m"].iter()) {
        let (bytes, img) = open(name);
        let json = common::load_json(name);
        let lvs = &json["lvstores"][0];
        let sb = SuperBlock::decode(&bytes[..PAGE_SIZE]).unwrap();
        assert_eq!(sb, img.super_block);
        assert_eq!(sb.version, 3, "{name}");
        assert_eq!(sb.length, 4096);
        assert_eq!(sb.bstype_str(), "LVOLSTORE");
        assert_eq!(sb.is_clean(), *name != "dirty_1m", "{name}");
        assert_eq!(u64::from(sb.cluster_size), lvs["cluster_size"].as_u64().unwrap(), "{name}");
        assert_eq!(u64::from(sb.io_unit_size), lvs["block_size"].as_u64().unwrap(), "{name}");
        assert_eq!(sb.md_page_size, 4096);
        assert_eq!(sb.size, 64 << 20);
        // SPDK's layout: super block, then one page for each mask, then the md region with one
        // page per cluster (lvol's default md pages per cluster ratio of 100%).
        let g = img.geometry;
        assert_eq!(
            (sb.used_page_mask_start, sb.used_cluster_mask_start, sb.used_blobid_mask_start, sb.md_start),
            (1, 2, 3, 4)
        );
        assert_eq!((sb.used_page_mask_len, sb.used_cluster_mask_len, sb.used_blobid_mask_len), (1, 1, 1));
        assert_eq!(u64::from(sb.md_len), g.total_clusters);
        assert_eq!(g.total_clusters - g.md_clusters, lvs["total_data_clusters"].as_u64().unwrap());
        // The super blob is the lvstore's: name and uuid xattrs.
        assert_eq!(sb.super_blob, page_to_blobid(0));
        let names = LvolNames::of(md(&img, sb.super_blob));
        assert_eq!(names.name.as_deref(), lvs["name"].as_str());
        assert_eq!(names.uuid.as_deref(), lvs["uuid"].as_str());
        if sb.is_clean() {
            // The free cluster count SPDK reported is what the cluster mask leaves free.
            let used = img.used_clusters.as_ref().unwrap().count_ones();
            assert_eq!(g.total_clusters - used, lvs["free_clusters"].as_u64().unwrap(), "{name}");
        }
    }
}

#[test]
fn lvols_match_what_spdk_reported() {
    for name in CLEAN_IMAGES.iter().chain(["dirty_1m"].iter()) {
        let (_, img) = open(name);
        let json = common::load_json(name);
        let lvols = json["lvols"].as_array().unwrap();
        let cluster_size = u64::from(img.geometry.cluster_size);
        // One blob per lvol, plus the super blob.
        assert_eq!(img.blobs.len(), lvols.len() + 1, "{name}");
        for l in lvols {
            let lname = l["name"].as_str().unwrap();
            let md = lvol_by_uuid(&img, l["uuid"].as_str().unwrap());
            let names = LvolNames::of(md);
            assert_eq!(names.name.as_deref(), Some(lname), "{name}");
            assert_eq!(md.is_thin_provisioned(), l["is_thin_provisioned"].as_bool().unwrap(), "{name}/{lname}");
            assert_eq!(md.allocated_clusters(), l["num_allocated_clusters"].as_u64().unwrap(), "{name}/{lname}");
            // Every lvol SPDK creates uses an extent table.
            assert!(md.uses_extent_table());
            let bdev = json["bdevs"].as_array().unwrap().iter().find(|b| b["uuid"] == l["uuid"]).unwrap();
            let size = bdev["num_blocks"].as_u64().unwrap() * bdev["block_size"].as_u64().unwrap();
            assert_eq!(md.num_clusters * cluster_size, size, "{name}/{lname}");
            let lv = &bdev["driver_specific"]["lvol"];
            // Parent: the SNAP internal xattr of the thin clone names the snapshot's blob.
            let parent = md.parent().unwrap();
            match lv.get("base_snapshot").and_then(Value::as_str) {
                Some(snap) => {
                    let Some(Parent::Snapshot(pid)) = parent else { panic!("{lname} has no parent") };
                    assert_eq!(LvolNames::of(self::md(&img, pid)).name.as_deref(), Some(snap));
                    assert!(l["is_clone"].as_bool().unwrap());
                }
                None => assert_eq!(parent, None, "{name}/{lname}"),
            }
            // Snapshots are read-only, and their clones are the blobs naming them.
            let is_snapshot = l["is_snapshot"].as_bool().unwrap();
            assert_eq!(md.is_read_only(), is_snapshot, "{name}/{lname}");
            let clones: BTreeSet<String> = img
                .blobs
                .iter()
                .filter_map(|b| b.md.as_ref().ok())
                .filter(|c| c.parent().unwrap() == Some(Parent::Snapshot(md.id)))
                .filter_map(|c| LvolNames::of(c).name)
                .collect();
            let want: BTreeSet<String> = lv
                .get("clones")
                .and_then(Value::as_array)
                .map(|a| a.iter().map(|c| c.as_str().unwrap().to_string()).collect())
                .unwrap_or_default();
            assert_eq!(clones, want, "{name}/{lname}");
            assert_eq!(!clones.is_empty(), is_snapshot);
        }
    }
}

#[test]
fn lvol_details_spdk_leaves_on_disk() {
    let (_, img) = open("lvs_1m");
    let by_name = |n: &str| {
        img.blobs
            .iter()
            .filter_map(|b| b.md.as_ref().ok())
            .find(|md| LvolNames::of(md).name.as_deref() == Some(n))
            .unwrap()
    };
    // A new lvol's name is stored in a 64-byte zero-padded value; a rename stores strlen + 1.
    assert_eq!(by_name("thick").xattr("name").unwrap().value.len(), 64);
    assert_eq!(by_name("renamed").xattr("name").unwrap().value, b"renamed\0");
    assert_eq!(by_name("thick").xattr("uuid").unwrap().value.len(), 37);
    // Clear method "none" is stored in md_ro_flags.
    assert_eq!(by_name("resized").md_ro_flags, 1);
    // The snapshot took the thin lvol's clusters (maps swapped): it stays flagged thin, is
    // read-only, and the thin lvol became its clone with clusters of its own only where it
    // was written afterwards. No cluster is shared.
    let snap = by_name("snap");
    let thin = by_name("thin");
    let clone = by_name("clone");
    assert!(snap.is_thin_provisioned() && snap.is_read_only());
    assert_eq!(thin.parent().unwrap(), Some(Parent::Snapshot(snap.id)));
    assert_eq!(clone.parent().unwrap(), Some(Parent::Snapshot(snap.id)));
    assert_eq!(snap.clusters.iter().filter(|&&c| c != 0).count(), 2); // written clusters 1 and 3
    assert!(snap.clusters[1] != 0 && snap.clusters[3] != 0);
    assert!(thin.clusters[0] != 0 && clone.clusters[2] != 0);
    for c in thin.clusters.iter().chain(clone.clusters.iter()).filter(|&&c| c != 0) {
        assert!(!snap.clusters.contains(c));
    }
    // The resized lvol grew from 1 to 3 clusters.
    assert_eq!(by_name("resized").num_clusters, 3);
}

/// Re-serializes every blob of an image and compares with SPDK's pages; returns how many
/// extent pages carried another blob's id.
fn reserialize_and_compare(name: &str) -> usize {
    let mut inherited = 0;
    let (bytes, img) = open(name);
    let g = img.geometry;
    let page_at = |p: u32| {
        let off = ((u64::from(g.md_start) + u64::from(p)) * u64::from(g.md_page_size)) as usize;
        &bytes[off..off + PAGE_SIZE]
    };
    for b in &img.blobs {
        let md = b.md.as_ref().unwrap();
        let mut pages = md.serialize().unwrap();
        assert_eq!(pages.len(), b.chain.len(), "{name} blob {:#x}", b.id);
        link_chain(&mut pages, &b.chain[1..]).unwrap();
        for (page, &p) in pages.iter().zip(&b.chain) {
            assert_eq!(&page.encode()[..], page_at(p), "{name} blob {:#x} md page {p}", b.id);
        }
        let table = md.extent_table.as_ref().unwrap();
        for (n, &p) in table.iter().enumerate().filter(|(_, &p)| p != 0) {
            let ours = md.extent_page(n as u64);
            let disk = MdPage::decode_checked(page_at(p)).unwrap();
            if ours.id == disk.id {
                assert_eq!(&ours.to_page().unwrap().encode()[..], page_at(p), "{name} {:#x} ep {n}", b.id);
            } else {
                // The one legitimate difference: a snapshot's extent pages were written by the
                // blob it snapshots (SPDK swaps the maps and does not rewrite them), so they
                // carry that blob's id (and a CRC over it). Everything else is identical.
                assert!(md.is_read_only(), "{name}: only snapshots inherit extent pages");
                assert!(img
                    .blobs
                    .iter()
                    .any(|o| o.id == disk.id
                        && o.md.as_ref().unwrap().parent().unwrap() == Some(Parent::Snapshot(md.id))));
                inherited += 1;
                let mut theirs = ours.clone();
                theirs.id = disk.id;
                assert_eq!(&theirs.to_page().unwrap().encode()[..], page_at(p), "{name} {:#x} ep {n}", b.id);
            }
        }
    }
    // The masks re-encode to the same region bytes.
    let sb = &img.super_block;
    for (mask, start, len) in [
        (img.used_pages.as_ref().unwrap(), sb.used_page_mask_start, sb.used_page_mask_len),
        (img.used_clusters.as_ref().unwrap(), sb.used_cluster_mask_start, sb.used_cluster_mask_len),
        (img.used_blobids.as_ref().unwrap().as_ref().unwrap(), sb.used_blobid_mask_start, sb.used_blobid_mask_len),
    ] {
        let off = start as usize * g.md_page_size as usize;
        let n = len as usize * g.md_page_size as usize;
        assert_eq!(mask.encode(n).unwrap(), &bytes[off..off + n], "{name} {:?}", mask.kind);
    }
    assert_eq!(&sb.encode()[..], &bytes[..PAGE_SIZE]);
    inherited
}

#[test]
fn reserialized_metadata_matches_spdk_bytes() {
    for name in ["lvs_1m", "lvs_4m", "dirty_1m", "recovered_1m"] {
        // Each image has one snapshot, with one extent page inherited from the snapshotted lvol.
        assert_eq!(reserialize_and_compare(name), 1, "{name}");
    }
}

#[test]
fn clean_images_check_clean() {
    for name in CLEAN_IMAGES {
        let (_, img) = open(name);
        let r = offline::check(&img);
        assert!(r.is_ok(), "{name}: {:?}", r.problems);
        assert!(r.clean);
        assert_eq!(r.blobs, img.blobs.len());
        // Masks say exactly what is in use.
        assert_eq!(r.used_pages, img.used_pages.as_ref().unwrap().count_ones());
        assert_eq!(r.used_clusters + img.geometry.md_clusters, img.used_clusters.as_ref().unwrap().count_ones());
    }
}

#[test]
fn dirty_image_has_stale_masks_that_spdk_recovery_rebuilds() {
    let (_, dirty) = open("dirty_1m");
    let (_, recovered) = open("recovered_1m");
    // After the kill: new lvol "afterkill" (blob 0xc, chain page 12, extent page 13, clusters
    // 10-11), "thick" grew by cluster 12, "renamed" (blob 6) was deleted and its page zeroed.
    // The md pages were written synchronously; the masks were not (SPDK only writes them when
    // it unloads), and the super block says dirty.
    let r = offline::check(&dirty);
    let afterkill = page_to_blobid(12);
    let thick = page_to_blobid(1);
    assert_eq!(
        r.problems,
        vec![
            Problem::NotClean,
            Problem::PageNotMarked { page: 12, blob: afterkill },
            Problem::PageNotMarked { page: 13, blob: afterkill },
            Problem::PageLeaked { page: 6 },
            Problem::BlobIdNotMarked { blob: afterkill },
            Problem::BlobIdLeaked { page: 6 },
            Problem::ClusterNotMarked { cluster: 10, blob: afterkill },
            Problem::ClusterNotMarked { cluster: 11, blob: afterkill },
            Problem::ClusterNotMarked { cluster: 12, blob: thick },
        ]
    );
    // SPDK loaded it ("Performing recovery on blobstore"), replayed every md page, and wrote
    // masks equal to what rebuilt_masks computes from the dirty image; the md pages themselves
    // are unchanged.
    let log = common::load_json("recovered_1m")["log"].to_string();
    assert!(log.contains("Performing recovery on blobstore"));
    let rebuilt = offline::rebuilt_masks(&dirty);
    assert_eq!(&rebuilt.used_pages, recovered.used_pages.as_ref().unwrap());
    assert_eq!(&rebuilt.used_clusters, recovered.used_clusters.as_ref().unwrap());
    assert_eq!(&rebuilt.used_blobids, recovered.used_blobids.as_ref().unwrap().as_ref().unwrap());
    for (d, r) in dirty.blobs.iter().zip(&recovered.blobs) {
        assert_eq!(d.md.as_ref().unwrap(), r.md.as_ref().unwrap());
        assert_eq!((&d.chain, &d.extent_pages), (&r.chain, &r.extent_pages));
    }
    assert_eq!(dirty.blobs.len(), recovered.blobs.len());
    // The deleted lvol's first page is gone from both.
    assert!(dirty.blob(page_to_blobid(6)).is_none());
    assert_eq!(blobid_to_page(afterkill), 12);
}

/// Builds an lvstore from nothing with the encoders only: super block, masks, the lvstore's
/// super blob, a thick lvol with an extent page and a thin one without.
fn build_lvstore() -> Vec<u8> {
    use ferrite_blob::format::blob::{link_chain, Xattr, FLAG_EXTENT_TABLE, FLAG_THIN_PROV};
    use ferrite_blob::format::superblock::BSTYPE_LVOLSTORE;
    use ferrite_blob::format::{MaskKind, MdMask};
    let size = 64u64 << 20;
    let mut bstype = [0u8; 16];
    bstype[..9].copy_from_slice(BSTYPE_LVOLSTORE);
    let sb = SuperBlock {
        version: 3,
        length: 4096,
        clean: 1,
        super_blob: page_to_blobid(0),
        cluster_size: 1 << 20,
        used_page_mask_start: 1,
        used_page_mask_len: 1,
        used_cluster_mask_start: 2,
        used_cluster_mask_len: 1,
        md_start: 4,
        md_len: 64,
        bstype,
        used_blobid_mask_start: 3,
        used_blobid_mask_len: 1,
        size,
        io_unit_size: 512,
        md_page_size: 4096,
    };
    let mut img = vec![0u8; size as usize];
    img[..PAGE_SIZE].copy_from_slice(&sb.encode());
    let md_page = |p: u32| (4 + p as usize) * PAGE_SIZE;
    let put_blob = |img: &mut Vec<u8>, md: &BlobMd| {
        let mut pages = md.serialize().unwrap();
        link_chain(&mut pages, &[]).unwrap();
        let at = md_page(blobid_to_page(md.id));
        img[at..at + PAGE_SIZE].copy_from_slice(&pages[0].encode());
    };
    let mut lvs = BlobMd::new(page_to_blobid(0));
    lvs.xattrs.push(Xattr::new("uuid", b"5b0d1cf6-3f0e-4b59-9d0a-6a3f1e2b7c11\0".to_vec()));
    lvs.xattrs.push(Xattr::new("name", b"ferlvs\0".to_vec()));
    put_blob(&mut img, &lvs);
    let lvol = |page: u32, name: &str, uuid: &str, thin: bool, clusters: Vec<u32>, ep: u32| {
        let mut md = BlobMd::new(page_to_blobid(page.into()));
        md.invalid_flags = FLAG_EXTENT_TABLE | if thin { FLAG_THIN_PROV } else { 0 };
        let mut n = name.as_bytes().to_vec();
        n.resize(64, 0);
        md.xattrs.push(Xattr::new("name", n));
        md.xattrs.push(Xattr::new("uuid", format!("{uuid}\0").into_bytes()));
        md.num_clusters = clusters.len() as u64;
        md.clusters = clusters;
        md.extent_table = Some(vec![ep]);
        md
    };
    let thick = lvol(1, "fthick", "0c6c2f0e-8a4e-4f7e-9a55-3b1d2e4f5a61", false, vec![1, 2], 2);
    put_blob(&mut img, &thick);
    let ep = thick.extent_page(0).to_page().unwrap();
    img[md_page(2)..md_page(2) + PAGE_SIZE].copy_from_slice(&ep.encode());
    let thin = lvol(3, "fthin", "7e1f3a2b-5c4d-4e6f-8a9b-0c1d2e3f4a5b", true, vec![0, 0, 0], 0);
    put_blob(&mut img, &thin);
    let mut masks = [
        (MdMask::new(MaskKind::UsedPages, 64), 1usize),
        (MdMask::new(MaskKind::UsedClusters, 64), 2),
        (MdMask::new(MaskKind::UsedBlobIds, 64), 3),
    ];
    for p in [0, 1, 2, 3] {
        masks[0].0.set(p, true);
    }
    for c in [0, 1, 2] {
        masks[1].0.set(c, true);
    }
    for p in [0, 1, 3] {
        masks[2].0.set(p, true);
    }
    for (m, page) in &masks {
        img[page * PAGE_SIZE..(page + 1) * PAGE_SIZE].copy_from_slice(&m.encode(PAGE_SIZE).unwrap());
    }
    img
}

#[test]
fn lvstore_built_from_encoders_checks_clean() {
    let img = build_lvstore();
    let image = offline::open(&img, &offline::OpenOptions::default()).unwrap();
    let r = offline::check(&image);
    assert!(r.is_ok(), "{:?}", r.problems);
    assert_eq!(r.blobs, 3);
}

/// Writes the lvstore built from the encoders to $FERRITE_BLOB_IMAGE, for loading into SPDK by
/// hand (`bdev_aio_create IMAGE aio0 512`, then `bdev_lvol_get_lvstores` and
/// `bdev_lvol_get_lvols` show lvstore "ferlvs" with lvols "fthick" and "fthin").
#[test]
#[ignore]
fn write_lvstore_for_spdk() {
    let path = std::env::var("FERRITE_BLOB_IMAGE").expect("FERRITE_BLOB_IMAGE");
    std::fs::write(path, build_lvstore()).unwrap();
}
