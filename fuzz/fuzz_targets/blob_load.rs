//! Fuzzes the runtime blobstore load (`ferrite_blob::store::Blobstore::load`) on hostile
//! metadata (issue 10): no panic, a clear error, nothing written when it fails.
//!
//! Once per process the deterministic simulator builds four small valid blobstore images (a
//! 2 MiB crash disk, 64 KiB clusters, 32 metadata pages) holding a thick blob with an xattr, a
//! thin blob with an extent table and allocated clusters, a thin blob with RLE extents and a
//! chain of several pages, and a snapshot with two clones (one with a cluster of its own):
//!
//! - 0: unloaded (clean super block, masks as written);
//! - 1: the same before the unload (not clean: the load rebuilds the masks);
//! - 2, 3: as 0 and 1 with a snapshot of the RLE blob left prepared and not committed
//!   (`SNAPTMP`), which the load's recovery removes (writes on success).
//!
//! An input is byte 0, whose low two bits pick the base image, then records, each a 6-byte
//! header `target: u8, page: u8, start: u16 LE, len: u16 LE` and up to `len` bytes written at
//! byte `start % 4096` of the page. The low 3 bits of `target` pick the region of the base
//! image (0 super block, 1 used page mask, 2 used cluster mask, 3 used blob id mask, 4 and 6-7
//! metadata region, 5 any page of the metadata area) and `page` a page of it (modulo its
//! length); bit 7 recomputes the page's CRC once every record is written, so that inputs get
//! past the CRC checks.
//!
//! The mutated image goes on a fresh crash disk in a fresh simulator, which loads it with
//! `Blobstore::load(dev, Some("LVOLSTORE"))`. Findings (a panic, libFuzzer's crash):
//! - anything that panics in the load, in opening a blob or in the unload, or allocates past
//!   libFuzzer's RSS limit (`-rss_limit_mb`, 2 GiB by default);
//! - a load that fails having changed the disk (current contents, unflushed writes included);
//! - a load that succeeds and then opening one of its blobs hangs or its unload fails (with
//!   every handle dropped, unload must succeed);
//! - a hang: no answer while the simulation has nothing left to run, or [`STALL_STEPS`] steps
//!   without any request reaching the disk (the load's work is I/O; spinning without I/O is a
//!   livelock). A load still issuing I/O after [`MAX_STEPS`] steps is given up, not reported:
//!   the image bounds the work of a correct load, but a crafted one (say, every blob with a
//!   long extent table naming one valid extent page over and over) can need more I/O than one
//!   fuzz iteration affords, and that is slowness, not a hang.

#![no_main]

use ferrite_testkit::crash_disk::{self, CrashDisk};
use ferrite_bdev::Bdev;
use ferrite_blob::format::crc::page_crc;
use ferrite_blob::format::{SuperBlock, PAGE_SIZE};
use ferrite_blob::store::{Blob, BlobOpts, Blobstore, BsResult, Dev, InitClear, StoreOpts};
use ferrite_reactor::oneshot::Receiver;
use ferrite_reactor::Sim;
use libfuzzer_sys::fuzz_target;
use std::collections::BTreeSet;
use std::sync::OnceLock;

const BLOCK: u32 = 4096;
const DISK_BYTES: usize = 2 << 20;
const CLUSTER: u32 = 64 << 10;
const MD_PAGES: u32 = 32;
const BSTYPE: &str = "LVOLSTORE";
/// Steps after which a load that keeps doing I/O is given up (see the module doc).
const MAX_STEPS: u64 = 2_000_000;
/// Steps without a disk request after which a load that has not answered is hung.
const STALL_STEPS: u64 = 100_000;
/// Steps the one-time build of the base images may take.
const BUILD_STEPS: u64 = 50_000_000;

/// The base images and where their regions are.
struct Bases {
    images: [Vec<u8>; 4],
    /// (first page, page count) per region: super block, the three masks, metadata region, all.
    regions: [(u32, u32); 6],
}

fn open_dev(name: &str) -> Dev {
    let desc = Bdev::open_ext(name, true, |_| {}).expect("open the disk");
    desc.claim("blobstore").expect("claim the disk");
    Dev::new(desc)
}

fn store_opts() -> StoreOpts {
    StoreOpts { cluster_size: CLUSTER, num_md_pages: Some(MD_PAGES), bstype: BSTYPE.into(), clear: InitClear::Unmap }
}

/// Creates blob `opts` and opens it.
async fn create_open(bs: &Blobstore, opts: BlobOpts) -> Blob {
    let id = bs.create_blob(&opts).await.expect("create a blob");
    bs.open_blob(id).await.expect("open a new blob")
}

fn name(v: &str) -> Vec<(String, Vec<u8>)> {
    vec![("name".into(), v.as_bytes().to_vec())]
}

/// Fills a new blobstore with one blob of each kind; every handle is dropped at the end.
async fn populate(bs: &Blobstore) {
    let thick = BlobOpts { num_clusters: 2, xattrs: name("thick"), ..Default::default() };
    bs.create_blob(&thick).await.expect("thick blob");

    let thin = create_open(bs, BlobOpts { num_clusters: 8, thin: true, ..Default::default() }).await;
    for c in [1, 6] {
        thin.allocate_cluster(c).await.expect("allocate");
    }
    thin.set_xattr("uuid", b"0123456789abcdef").expect("xattr");
    thin.sync_md().await.expect("sync");

    // Three 2000-byte xattrs do not fit one page: a chain.
    let mut xattrs = name("rle");
    for i in 0..3u8 {
        xattrs.push((format!("big{i}"), vec![b'a' + i; 2000]));
    }
    let rle_opts = BlobOpts { num_clusters: 4, thin: true, rle_extents: true, xattrs, ..Default::default() };
    let rle = create_open(bs, rle_opts).await;
    for c in [0, 3] {
        rle.allocate_cluster(c).await.expect("allocate");
    }

    let base = create_open(bs, BlobOpts { num_clusters: 3, xattrs: name("base"), ..Default::default() }).await;
    let snap_id = bs.prepare_snapshot(&base, name("snap")).await.expect("prepare snapshot");
    let snap = bs.commit_snapshot(&base, snap_id).await.expect("commit snapshot");
    base.allocate_cluster(0).await.expect("allocate in the first clone");
    let clone_id = bs.create_clone(&snap, name("clone")).await.expect("clone");
    let clone = bs.open_blob(clone_id).await.expect("open the clone");
    clone.allocate_cluster(2).await.expect("allocate in the clone");
}

/// Builds the four base images (see the module doc).
fn build_bases() -> Bases {
    let mut sim = Sim::new(1, 1).expect("a simulator");
    let disk = sim.on(0, || crash_disk::create("B0", BLOCK, vec![0; DISK_BYTES])).expect("a disk");
    let rx = sim.engine().run_async(0, || async {
        let bs = Blobstore::init(open_dev("B0"), &store_opts()).await.expect("init");
        populate(&bs).await;
        bs
    });
    let bs = sim.block_on(rx, BUILD_STEPS).expect("populated");
    let dirty = disk.image();
    let rx = sim.engine().run_async(0, move || async move { bs.unload().await });
    sim.block_on(rx, BUILD_STEPS).expect("answered").expect("unload");
    let clean = disk.image();

    let disk = sim.on(0, || crash_disk::create("B1", BLOCK, clean.clone())).expect("a disk");
    let rx = sim.engine().run_async(0, || async {
        let bs = Blobstore::load(open_dev("B1"), Some(BSTYPE)).await.expect("load a base image");
        // A snapshot of the RLE blob: RLE extents too, a few bytes from naming clusters.
        let mut rle = None;
        for id in bs.blob_ids() {
            let b = bs.open_blob(id).await.expect("open");
            if b.xattr("name").as_deref() == Some(&b"rle"[..]) {
                rle = Some(b);
            }
        }
        let rle = rle.expect("the RLE blob");
        bs.prepare_snapshot(&rle, name("pending")).await.expect("prepare snapshot");
        drop(rle);
        bs
    });
    let bs = sim.block_on(rx, BUILD_STEPS).expect("prepared");
    let dirty_pending = disk.image();
    let rx = sim.engine().run_async(0, move || async move { bs.unload().await });
    sim.block_on(rx, BUILD_STEPS).expect("answered").expect("unload");
    let clean_pending = disk.image();
    drop(sim);

    let sb = SuperBlock::decode(&clean).expect("the base super block decodes");
    let all = sb.md_start + sb.md_len;
    let regions = [
        (0, 1),
        (sb.used_page_mask_start, sb.used_page_mask_len),
        (sb.used_cluster_mask_start, sb.used_cluster_mask_len),
        (sb.used_blobid_mask_start, sb.used_blobid_mask_len),
        (sb.md_start, sb.md_len),
        (0, all),
    ];
    Bases { images: [clean, dirty, clean_pending, dirty_pending], regions }
}

fn bases() -> &'static Bases {
    static BASES: OnceLock<Bases> = OnceLock::new();
    BASES.get_or_init(build_bases)
}

/// The absolute page a record's `target` and `page` bytes name.
fn record_page(b: &Bases, target: u8, page: u8) -> u32 {
    let region = match target & 7 {
        r @ 0..=3 => b.regions[usize::from(r)],
        5 => b.regions[5],
        _ => b.regions[4],
    };
    region.0 + u32::from(page) % region.1.max(1)
}

/// Writes the input's records over `image`; returns the pages whose CRC is to be recomputed.
fn apply_records(b: &Bases, image: &mut [u8], mut data: &[u8]) -> BTreeSet<u32> {
    let mut reseal = BTreeSet::new();
    while let [target, page, s0, s1, l0, l1, rest @ ..] = data {
        let p = record_page(b, *target, *page);
        let start = usize::from(u16::from_le_bytes([*s0, *s1])) % PAGE_SIZE;
        let len = usize::from(u16::from_le_bytes([*l0, *l1])).min(PAGE_SIZE - start).min(rest.len());
        let at = p as usize * PAGE_SIZE + start;
        image[at..at + len].copy_from_slice(&rest[..len]);
        if target & 0x80 != 0 {
            reseal.insert(p);
        }
        data = &rest[len..];
    }
    reseal
}

fn seal(image: &mut [u8], page: u32) {
    let p = &mut image[page as usize * PAGE_SIZE..(page as usize + 1) * PAGE_SIZE];
    let crc = page_crc(p);
    p[PAGE_SIZE - 4..].copy_from_slice(&crc.to_le_bytes());
}

/// The image an input describes.
fn mutated_image(data: &[u8]) -> Option<Vec<u8>> {
    let (&mode, records) = data.split_first()?;
    let b = bases();
    let mut image = b.images[usize::from(mode & 3)].clone();
    for p in apply_records(b, &mut image, records) {
        seal(&mut image, p);
    }
    Some(image)
}

/// What the simulated run answered.
enum Outcome {
    /// The load failed (its error, as text).
    LoadFailed(String),
    /// The load succeeded: each blob id it lists with the outcome of its open, and the unload.
    Loaded { opens: Vec<(u64, Result<(), String>)>, unload: BsResult<()> },
}

/// Loads the disk named `name`; if that works, opens each blob (dropping every handle) and
/// unloads.
async fn load_open_unload(name: &str) -> Outcome {
    let bs = match Blobstore::load(open_dev(name), Some(BSTYPE)).await {
        Ok(bs) => bs,
        Err(e) => return Outcome::LoadFailed(e.to_string()),
    };
    let mut opens = Vec::new();
    for id in bs.blob_ids() {
        let r = bs.open_blob(id).await.map(drop).map_err(|e| e.to_string());
        opens.push((id, r));
    }
    let unload = bs.unload().await;
    Outcome::Loaded { opens, unload }
}

/// Requests the disk has served so far.
fn disk_requests(disk: &CrashDisk) -> u64 {
    let c = disk.counts();
    c.reads + c.writes + c.flushes + c.failed
}

/// Steps `sim` until `rx` answers. None if the run was given up while still doing I/O after
/// [`MAX_STEPS`]; panics on a hang (see the module doc).
fn drive<T>(sim: &mut Sim, disk: &CrashDisk, mut rx: Receiver<T>) -> Option<T> {
    let (mut last_io, mut last_io_step) = (disk_requests(disk), 0u64);
    for step in 0..MAX_STEPS {
        if let Some(v) = rx.try_recv() {
            return Some(v.expect("the load task was dropped without answering"));
        }
        assert!(sim.step(), "hang: nothing left to run and the load has not answered (after {step} steps)");
        let io = disk_requests(disk);
        if io != last_io {
            (last_io, last_io_step) = (io, step);
        }
        assert!(
            step - last_io_step < STALL_STEPS,
            "hang: {STALL_STEPS} steps without a disk request and no answer ({})",
            sim.describe()
        );
    }
    rx.try_recv().map(|v| v.expect("the load task was dropped without answering"))
}

/// Loads `image` in a fresh simulator and checks the outcome.
fn check_load(image: Vec<u8>) {
    let mut sim = Sim::new(1, 1).expect("a simulator");
    let disk = sim.on(0, || crash_disk::create("F", BLOCK, image.clone())).expect("a disk");
    let rx = sim.engine().run_async(0, || load_open_unload("F"));
    let Some(outcome) = drive(&mut sim, &disk, rx) else { return };
    match outcome {
        Outcome::LoadFailed(e) => {
            if disk.current_image() != image {
                let changed = first_changed_page(&disk.current_image(), &image);
                panic!("the load failed ({e}) but wrote the disk (first changed page: {changed:?})");
            }
        }
        Outcome::Loaded { opens, unload } => {
            if let Err(e) = unload {
                panic!("the load succeeded but the unload failed: {e} (opens: {opens:?})");
            }
        }
    }
}

fn first_changed_page(a: &[u8], b: &[u8]) -> Option<usize> {
    a.chunks(PAGE_SIZE).zip(b.chunks(PAGE_SIZE)).position(|(x, y)| x != y)
}

fuzz_target!(|data: &[u8]| {
    if let Some(image) = mutated_image(data) {
        check_load(image);
    }
});
