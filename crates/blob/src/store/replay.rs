//! Recovery of a blobstore that was not unloaded cleanly (SPDK's `bs_recover`): the masks on
//! the device are stale, so they are rebuilt from what the metadata region holds. Every page
//! is read in order; a valid first page of a blob (its CRC matches, sequence number 0, and the
//! id names that page) starts a chain, which is followed (each page valid, of that blob, in
//! sequence), and its extent pages are read. The chain's pages, its extent pages, the clusters
//! its extents name, its id, and the clusters the metadata itself occupies are marked used. A
//! chain that breaks (an update that did not finish) keeps the pages before the break. An
//! extent page a valid chain names that is not a valid extent page fails the load, as in
//! SPDK: the blob's clusters could not be known, and handing them out again would lose data.

use super::{BsError, BsResult, Store};
use crate::format::descriptor::{parse_area, Descriptor};
use crate::format::units::page_to_blobid;
use crate::format::{ExtentPage, FormatError, MdPage, INVALID_MD_PAGE, PAGE_SIZE};

/// Pages read per request while scanning the region.
const SCAN_CHUNK: u32 = 256;

/// Rebuilds the store's masks from its metadata region.
pub(crate) async fn recover(s: &Store) -> BsResult<()> {
    let len = s.geo.md_len;
    let mut raw: Vec<MdPage> = Vec::with_capacity(len as usize);
    let mut at = 0u32;
    while at < len {
        let n = SCAN_CHUNK.min(len - at);
        let bytes = s.dev.read(s.page_offset(at), n as usize * PAGE_SIZE).await?;
        for chunk in bytes.chunks(PAGE_SIZE) {
            raw.push(MdPage::decode(chunk)?);
        }
        at += n;
    }
    let valid: Vec<bool> = raw.iter().map(|p| p.crc_ok()).collect();
    let mut st = s.lock();
    st.pages = super::bits::BitArray::new(len as usize);
    st.clusters = super::bits::BitArray::new(s.geo.total_clusters as usize);
    st.blobids = super::bits::BitArray::new(len as usize);
    for c in 0..s.geo.md_clusters as usize {
        st.clusters.set(c);
    }
    let mut blobs = 0u64;
    for root in 0..len {
        let p = &raw[root as usize];
        if !valid[root as usize]
            || p.sequence_num != 0
            || p.id != page_to_blobid(root as u64)
            || st.pages.get(root as usize)
        {
            continue;
        }
        blobs += 1;
        st.blobids.set(root as usize);
        let mut cur = root;
        let mut seq = 0u32;
        let mut extent_pages = Vec::new();
        loop {
            st.pages.set(cur as usize);
            let page = &raw[cur as usize];
            let descs = parse_area(&page.descriptors[..])?;
            for d in &descs {
                match d {
                    Descriptor::ExtentRle(runs) => {
                        for r in runs {
                            if r.cluster_idx != 0 {
                                for c in r.cluster_idx as u64..r.cluster_idx as u64 + r.length as u64 {
                                    mark_cluster(&mut st.clusters, c, page.id)?;
                                }
                            }
                        }
                    }
                    Descriptor::ExtentTable { entries, .. } => {
                        for e in entries {
                            if e.page_idx != 0 {
                                extent_pages.push(e.page_idx);
                            }
                        }
                    }
                    _ => {}
                }
            }
            let next = page.next;
            if next == INVALID_MD_PAGE {
                break;
            }
            seq += 1;
            let ok = next < len
                && valid[next as usize]
                && raw[next as usize].id == page.id
                && raw[next as usize].sequence_num == seq
                && !st.pages.get(next as usize);
            if !ok {
                log::warn!("blobstore recovery: blob {:#x}: its metadata chain breaks at page {next}", page.id);
                break;
            }
            cur = next;
        }
        for ep in extent_pages {
            let bad = |why: &str| {
                BsError::Format(FormatError::BadChain(format!(
                    "blob {:#x}: extent page {ep} {why}",
                    page_to_blobid(root as u64)
                )))
            };
            if ep >= len || !valid[ep as usize] {
                return Err(bad("is not a valid page"));
            }
            let e = ExtentPage::from_page(&raw[ep as usize]).map_err(|_| bad("is not an extent page"))?;
            st.pages.set(ep as usize);
            for &c in e.clusters.iter().filter(|&&c| c != 0) {
                mark_cluster(&mut st.clusters, c as u64, e.id)?;
            }
        }
    }
    log::info!("blobstore recovery: {blobs} blobs, {} clusters in use", st.clusters.count_ones());
    Ok(())
}

fn mark_cluster(clusters: &mut super::bits::BitArray, c: u64, blob: u64) -> BsResult<()> {
    if c as usize >= clusters.len() {
        return Err(BsError::Format(FormatError::BadChain(format!(
            "blob {blob:#x}: cluster {c} beyond the device's {}",
            clusters.len()
        ))));
    }
    clusters.set(c as usize);
    Ok(())
}
