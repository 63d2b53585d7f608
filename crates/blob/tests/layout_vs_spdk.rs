//! The layout Ferrite gives a new blobstore (store::layout) is the one SPDK v26.05 gave the
//! lvstores of the fixtures: same mask regions, metadata region and metadata clusters.

mod common;

use ferrite_blob::format::SuperBlock;
use ferrite_blob::store::layout::{lvs_md_pages, DevGeometry, InitOpts, Layout};

#[test]
fn new_layouts_match_spdk_lvstores() {
    for name in ["lvs_1m", "lvs_4m"] {
        let img = common::image(name);
        let sb = SuperBlock::decode(&img).unwrap();
        let bs = sb.io_unit_size;
        let dev = DevGeometry { block_size: bs, phys_block_size: bs, num_blocks: sb.size / bs as u64 };
        let total = sb.size / sb.cluster_size as u64;
        // bdev_lvol_create_lvstore's default: one metadata page per cluster (ratio 100).
        let md_pages = lvs_md_pages(total, 100) as u32;
        let l = Layout::new(
            dev,
            InitOpts { cluster_size: sb.cluster_size, num_md_pages: Some(md_pages), md_page_size: 4096 },
        )
        .unwrap();
        assert_eq!(l.used_page_mask, (sb.used_page_mask_start, sb.used_page_mask_len), "{name}: page mask");
        assert_eq!(l.used_cluster_mask, (sb.used_cluster_mask_start, sb.used_cluster_mask_len), "{name}: cluster mask");
        assert_eq!(l.used_blobid_mask, (sb.used_blobid_mask_start, sb.used_blobid_mask_len), "{name}: blob id mask");
        assert_eq!((l.md_start, l.md_len), (sb.md_start, sb.md_len), "{name}: metadata region");
        assert_eq!(l.md_clusters, sb.geometry(sb.size).unwrap().md_clusters, "{name}: metadata clusters");
        assert_eq!(l.size, sb.size, "{name}: size");
    }
}
