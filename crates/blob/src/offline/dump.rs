//! Human-readable report of an [`Image`].

use super::{Image, PageKind};
use crate::format::blob::{Parent, Xattr};
use crate::format::units::blobid_to_page;
use crate::format::{MdMask, BLOBID_INVALID};
use std::fmt::Write;

/// Renders the super block, a summary of the masks and every blob (id, flags, xattrs, clusters,
/// parent) as text.
pub fn dump(img: &Image) -> String {
    let mut o = String::new();
    let sb = &img.super_block;
    let g = &img.geometry;
    let _ = writeln!(o, "super block");
    let _ = writeln!(o, "  version {}  clean {}  bstype {:?}", sb.version, sb.clean, sb.bstype_str());
    let super_blob = if sb.super_blob == BLOBID_INVALID { "none".to_string() } else { format!("{:#x}", sb.super_blob) };
    let _ = writeln!(o, "  super blob {super_blob}");
    let _ = writeln!(
        o,
        "  size {} bytes ({} of device {})  cluster size {}  io unit {}  md page {}",
        g.size,
        if sb.size == 0 { "implied" } else { "stored" },
        img.device_size,
        g.cluster_size,
        g.io_unit_size,
        g.md_page_size
    );
    let _ = writeln!(
        o,
        "  clusters {} ({} hold metadata)  md region pages {}..{} ({} pages)",
        g.total_clusters,
        g.md_clusters,
        sb.md_start,
        u64::from(sb.md_start) + u64::from(sb.md_len),
        sb.md_len
    );
    let _ = writeln!(
        o,
        "  masks at pages: used pages {}+{}  used clusters {}+{}  used blob ids {}+{}",
        sb.used_page_mask_start,
        sb.used_page_mask_len,
        sb.used_cluster_mask_start,
        sb.used_cluster_mask_len,
        sb.used_blobid_mask_start,
        sb.used_blobid_mask_len
    );
    let _ = writeln!(o, "masks");
    let mask_line = |o: &mut String, name: &str, m: &Result<MdMask, crate::format::FormatError>| {
        let _ = match m {
            Ok(m) => writeln!(o, "  {name}: {} of {} set: {}", m.count_ones(), m.len(), ranges(m.ones())),
            Err(e) => writeln!(o, "  {name}: unreadable: {e}"),
        };
    };
    mask_line(&mut o, "used pages", &img.used_pages);
    mask_line(&mut o, "used clusters", &img.used_clusters);
    match &img.used_blobids {
        Some(m) => mask_line(&mut o, "used blob ids", m),
        None => {
            let _ = writeln!(o, "  used blob ids: none (pre-version-3 image)");
        }
    }
    let count = |k: PageKind| img.pages.iter().filter(|&&p| p == k).count();
    let _ = writeln!(
        o,
        "md pages: {} zero, {} blob roots, {} extent pages, {} other valid, {} bad crc",
        count(PageKind::Zero),
        count(PageKind::Root),
        count(PageKind::ExtentPage),
        count(PageKind::Other),
        count(PageKind::BadCrc)
    );
    let _ = writeln!(o, "blobs: {}", img.blobs.len());
    for b in &img.blobs {
        let _ = writeln!(o, "blob {:#x} (md page {})", b.id, blobid_to_page(b.id));
        let _ = writeln!(o, "  chain pages {:?}  extent pages {:?}", b.chain, b.extent_pages);
        let md = match &b.md {
            Ok(md) => md,
            Err(e) => {
                let _ = writeln!(o, "  UNREADABLE: {e}");
                continue;
            }
        };
        let mut flags = Vec::new();
        if md.is_thin_provisioned() {
            flags.push("thin");
        }
        if md.uses_extent_table() {
            flags.push("extent-table");
        }
        if md.is_read_only() {
            flags.push("read-only");
        }
        if md.is_esnap_clone() {
            flags.push("esnap-clone");
        }
        let _ = writeln!(
            o,
            "  flags invalid {:#x} data_ro {:#x} md_ro {:#x} [{}] clear method {:?} access {:?}",
            md.invalid_flags,
            md.data_ro_flags,
            md.md_ro_flags,
            flags.join(" "),
            md.clear_method(),
            md.access()
        );
        let _ = writeln!(
            o,
            "  clusters {} ({} allocated): {}",
            md.num_clusters,
            md.allocated_clusters(),
            runs(&md.clusters)
        );
        match md.parent() {
            Ok(Some(Parent::Snapshot(p))) => {
                let _ = writeln!(o, "  parent snapshot {p:#x}");
            }
            Ok(Some(Parent::External(id))) => {
                let _ = writeln!(o, "  parent external snapshot {}", printable(&id));
            }
            Ok(None) => {}
            Err(e) => {
                let _ = writeln!(o, "  parent: {e}");
            }
        }
        for x in &md.xattrs {
            let _ = writeln!(o, "  xattr {} = {}", printable(&x.name), value(x));
        }
        for x in &md.internal_xattrs {
            let _ = writeln!(o, "  internal xattr {} = {}", printable(&x.name), value(x));
        }
    }
    o
}

/// An xattr value: as a string when it is a C string of printable text (with any NUL padding),
/// as a little-endian number when it is 8 bytes, else hex.
fn value(x: &Xattr) -> String {
    let end = x.value.iter().position(|&c| c == 0).unwrap_or(x.value.len());
    let text = &x.value[..end];
    let padding_is_zero = x.value[end..].iter().all(|&c| c == 0);
    if !text.is_empty() && padding_is_zero && text.iter().all(|c| (0x20..0x7f).contains(c)) {
        return format!("{:?} ({} bytes)", String::from_utf8_lossy(text), x.value.len());
    }
    if let Ok(b) = <[u8; 8]>::try_from(x.value.as_slice()) {
        return format!("{:#x} (u64)", u64::from_le_bytes(b));
    }
    format!("0x{}", x.value.iter().map(|b| format!("{b:02x}")).collect::<String>())
}

/// Bytes as text if printable, else hex.
fn printable(b: &[u8]) -> String {
    if b.iter().all(|c| (0x20..0x7f).contains(c)) {
        String::from_utf8_lossy(b).into_owned()
    } else {
        format!("0x{}", b.iter().map(|c| format!("{c:02x}")).collect::<String>())
    }
}

/// Set bit indices as ranges: "0-3 7 9-10".
fn ranges(it: impl Iterator<Item = u64>) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut cur: Option<(u64, u64)> = None;
    for i in it {
        cur = match cur {
            Some((a, b)) if b + 1 == i => Some((a, i)),
            Some(r) => {
                out.push(range(r));
                Some((i, i))
            }
            None => Some((i, i)),
        };
    }
    if let Some(r) = cur {
        out.push(range(r));
    }
    if out.is_empty() {
        "-".into()
    } else {
        out.join(" ")
    }
}

fn range((a, b): (u64, u64)) -> String {
    if a == b {
        a.to_string()
    } else {
        format!("{a}-{b}")
    }
}

/// A cluster map as runs: "0-1:unallocated 2-4:clusters 17-19".
fn runs(clusters: &[u32]) -> String {
    let mut out = Vec::new();
    let mut i = 0;
    while i < clusters.len() {
        let c = clusters[i];
        let mut j = i + 1;
        while j < clusters.len()
            && ((c == 0 && clusters[j] == 0) || (c != 0 && u64::from(clusters[j]) == u64::from(c) + (j - i) as u64))
        {
            j += 1;
        }
        let blob_range = range((i as u64, (j - 1) as u64));
        out.push(if c == 0 {
            format!("{blob_range}:-")
        } else {
            format!("{blob_range}:{}", range((c.into(), u64::from(c) + (j - i - 1) as u64)))
        });
        if out.len() == 64 && j < clusters.len() {
            out.push("...".into());
            break;
        }
        i = j;
    }
    if out.is_empty() {
        "none".into()
    } else {
        out.join(" ")
    }
}
