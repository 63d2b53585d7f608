//! The runtime blobstore over the crash disk (a simulated disk with a volatile write cache) in
//! the deterministic simulator: what it writes reads back after an unload and a load, in the
//! format the offline checker accepts; and after power cuts at any point of any sequence of
//! metadata operations, the load recovers a consistent blobstore that holds every operation
//! that completed (SIM_SEEDS sets how many seeds, SIM_SEED replays one).

mod common;

use common::{check_image, open_dev};
use ferrite_blob::format::BlobMd;
use ferrite_blob::store::{BlobOpts, Blobstore, InitClear, StoreOpts};
use ferrite_reactor::sim::for_seeds;
use ferrite_reactor::Sim;
use ferrite_testkit::crash_disk::{self, CrashDisk};

const BLOCK: u32 = 4096;
const MIB: usize = 1 << 20;
const MAX_STEPS: u64 = 50_000_000;

fn opts() -> StoreOpts {
    StoreOpts { cluster_size: MIB as u32, num_md_pages: None, bstype: "BLOBTEST".into(), clear: InitClear::Unmap }
}

#[test]
fn blobs_survive_an_unload_and_a_load() {
    let mut sim = Sim::new(1, 1).unwrap();
    let disk = sim.on(0, || crash_disk::create("D", BLOCK, vec![0; 64 * MIB])).unwrap();
    let rx = sim.engine().run_async(0, || async {
        let bs = Blobstore::init(open_dev("D"), &opts()).await.unwrap();
        let thick = bs
            .create_blob(&BlobOpts {
                num_clusters: 4,
                xattrs: vec![("name".into(), b"thick\0".to_vec())],
                ..Default::default()
            })
            .await
            .unwrap();
        let thin = bs.create_blob(&BlobOpts { num_clusters: 8, thin: true, ..Default::default() }).await.unwrap();
        let b = bs.open_blob(thin).await.unwrap();
        // Past 512 clusters: a second extent page.
        b.resize(1000).await.unwrap();
        for c in [0, 5, 700] {
            b.allocate_cluster(c).await.unwrap();
        }
        assert_eq!(b.allocate_cluster(5).await.unwrap(), b.map().start(5).unwrap(), "a second allocation finds it");
        b.set_xattr("uuid", b"1234").unwrap();
        b.sync_md().await.unwrap();
        let t = bs.open_blob(thick).await.unwrap();
        assert_eq!(t.allocated_clusters(), 4);
        let before: (BlobMd, BlobMd) = (b.md(), t.md());
        let masks = bs.masks();
        assert!(bs.unload().await.is_err(), "unload refuses while blobs are open");
        drop((b, t));
        bs.unload().await.unwrap();
        (thick, thin, before, masks)
    });
    let (thick, thin, before, masks) = sim.block_on(rx, MAX_STEPS).unwrap();
    assert_eq!(disk.unflushed_blocks(), 0, "the unload flushed everything");
    let img = disk.image();
    let image = check_image(&img, "after unload");
    assert!(image.super_block.is_clean(), "marked clean");
    assert_eq!(image.blobs.len(), 2);
    // A new disk with that image: the load finds what was there.
    sim.on(0, || crash_disk::create("E", BLOCK, img)).unwrap();
    let rx = sim.engine().run_async(0, move || async move {
        let bs = Blobstore::load(open_dev("E"), Some("BLOBTEST")).await.unwrap();
        assert_eq!(bs.masks(), masks, "the masks read back");
        assert_eq!(bs.blob_ids(), vec![thick, thin]);
        let t = bs.open_blob(thick).await.unwrap();
        let b = bs.open_blob(thin).await.unwrap();
        assert_eq!((b.md(), t.md()), before, "the metadata reads back");
        assert_eq!(b.map().start(700), Some(before.0.clusters[700] as u64 * 256));
        assert_eq!(b.xattr("uuid").as_deref(), Some(&b"1234"[..]));
        // Shrink below an allocated cluster and delete the other blob: both give clusters back.
        let free = bs.free_clusters();
        b.resize(600).await.unwrap();
        assert_eq!(bs.free_clusters(), free + 1, "cluster 700 released");
        drop(t);
        bs.delete_blob(thick).await.unwrap();
        assert_eq!(bs.free_clusters(), free + 5, "the thick blob's 4 clusters released");
        assert!(bs.open_blob(thick).await.is_err());
        drop(b);
        bs.unload().await.unwrap();
    });
    sim.block_on(rx, MAX_STEPS).unwrap();
}

/// First writes that race: several allocations of one cluster of a thin blob, started together,
/// all get the one cluster the first claimed (two would lose one write's data); allocations of
/// other clusters in the same turn get clusters of their own; and what they recorded loads back.
#[test]
fn racing_allocations_of_one_cluster_share_it() {
    let mut sim = Sim::new(1, 1).unwrap();
    let disk = sim.on(0, || crash_disk::create("R", BLOCK, vec![0; 64 * MIB])).unwrap();
    let rx = sim.engine().run_async(0, || async {
        let bs = Blobstore::init(open_dev("R"), &opts()).await.unwrap();
        let id = bs.create_blob(&BlobOpts { num_clusters: 16, thin: true, ..Default::default() }).await.unwrap();
        let b = bs.open_blob(id).await.unwrap();
        let free = bs.free_clusters();
        // All are started before any runs: each finds cluster 3 unallocated.
        let tasks: Vec<_> = [3, 3, 9, 3, 4, 3, 9]
            .into_iter()
            .map(|c| {
                let b = b.clone();
                ferrite_reactor::spawn_local(async move { (c, b.allocate_cluster(c).await.unwrap()) })
            })
            .collect();
        let mut got = Vec::new();
        for t in tasks {
            got.push(t.await);
        }
        let start_of = |c: u64| got.iter().filter(|(i, _)| *i == c).map(|(_, s)| *s).collect::<Vec<_>>();
        let (s3, s4, s9) = (start_of(3), start_of(4), start_of(9));
        assert!(s3.iter().all(|&s| s == s3[0]), "every allocation of cluster 3 got the same cluster: {s3:?}");
        assert!(s9.iter().all(|&s| s == s9[0]), "both allocations of cluster 9 got the same cluster: {s9:?}");
        let mut distinct = vec![s3[0], s4[0], s9[0]];
        distinct.dedup();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), 3, "three clusters, three places: {got:?}");
        assert_eq!(bs.free_clusters(), free - 3, "three clusters taken from the store, not seven");
        assert_eq!(b.allocated_clusters(), 3);
        for (c, s) in [(3, s3[0]), (4, s4[0]), (9, s9[0])] {
            assert_eq!(b.map().start(c), Some(s), "cluster {c} published where its allocations said");
        }
        drop(b);
        bs.unload().await.unwrap();
        (id, s3[0], s4[0], s9[0])
    });
    let (id, s3, s4, s9) = sim.block_on(rx, MAX_STEPS).unwrap();
    let img = disk.image();
    let image = check_image(&img, "after racing allocations");
    let entry = image.blobs.iter().find(|b| b.id == id).expect("the blob is in the image");
    let md = entry.md.as_ref().expect("its metadata reads");
    let on_medium = |c: usize| md.clusters[c] as u64 * (MIB as u64 / BLOCK as u64);
    assert_eq!((on_medium(3), on_medium(4), on_medium(9)), (s3, s4, s9), "the metadata on the medium agrees");
    let allocated = md.clusters.iter().filter(|&&c| c != 0).count();
    assert_eq!(allocated, 3, "no other cluster recorded");
}

/// A blob as the operations that completed left it.
#[derive(Debug, Clone, PartialEq)]
struct ModelBlob {
    num_clusters: u64,
    thin: bool,
    tag: Option<Vec<u8>>,
    /// Clusters allocated and made durable by a flush since.
    certain: std::collections::BTreeSet<u64>,
    /// Clusters allocated with no flush since (on the medium or not).
    maybe: std::collections::BTreeSet<u64>,
    /// Clusters released with no flush since (still on the medium or not).
    released: std::collections::BTreeSet<u64>,
}

type Model = std::collections::BTreeMap<u64, ModelBlob>;

/// What the operations log: the model after the last completed operation, and the one before
/// the operation under way (whose outcome a crash may or may not keep).
#[derive(Default)]
struct Log {
    done: Model,
    before: Option<Model>,
    /// The model the operation under way leads to (creation aside: see `creating`).
    after: Option<Model>,
    /// The operation under way creates a blob with these properties (its id is not known).
    creating: Option<ModelBlob>,
    ops: u64,
}

/// Every allocation so far is now durable (a flush completed after it). Only once the
/// operation that flushes has completed: cut in the middle of it, its own writes and the
/// earlier unflushed ones reach the medium block by block, in any combination (a delete may be
/// there while an earlier allocation is not), so the model of the operation under way keeps
/// them as maybe.
fn settle(m: &mut Model) {
    for b in m.values_mut() {
        let maybe = std::mem::take(&mut b.maybe);
        b.certain.extend(maybe);
        b.released.clear();
    }
}

/// Random metadata operations until one fails (the power was cut) or `n` are done, logging
/// each into `log`.
async fn workload(bs: Blobstore, seed: u64, n: u64, log: std::sync::Arc<std::sync::Mutex<Log>>) {
    let mut rng = ferrite_reactor::SimRng::new(seed ^ 0x5eed);
    let mut model: Model = Model::new();
    for _ in 0..n {
        let ids: Vec<u64> = model.keys().copied().collect();
        let pick = |rng: &mut ferrite_reactor::SimRng| ids[rng.below(ids.len() as u64) as usize];
        let op = if ids.is_empty() { 0 } else { rng.below(7) };
        let mut next = model.clone();
        {
            let mut l = log.lock().unwrap();
            l.before = Some(model.clone());
            l.after = None;
            l.creating = None;
        }
        let res: Result<(), String> = match op {
            0 | 1 => {
                let thin = rng.chance(2, 3);
                let n = if thin { rng.below(1200) } else { rng.below(4) };
                let tag = rng.chance(1, 2).then(|| format!("blob-{}", rng.below(1000)).into_bytes());
                let mb = ModelBlob {
                    num_clusters: n,
                    thin,
                    tag: tag.clone(),
                    certain: Default::default(),
                    maybe: Default::default(),
                    released: Default::default(),
                };
                {
                    let mut after = next.clone();
                    settle(&mut after);
                    let mut l = log.lock().unwrap();
                    l.creating = Some(mb.clone());
                    l.after = Some(after);
                }
                let o = BlobOpts {
                    num_clusters: n,
                    thin,
                    xattrs: tag.into_iter().map(|t| ("tag".to_string(), t)).collect(),
                    ..Default::default()
                };
                match bs.create_blob(&o).await {
                    Ok(id) => {
                        next.insert(id, mb);
                        settle(&mut next);
                        Ok(())
                    }
                    Err(e) => Err(e.to_string()),
                }
            }
            2 => {
                let id = pick(&mut rng);
                let m = next.get_mut(&id).unwrap();
                let n = if m.thin { rng.below(1200) } else { m.num_clusters.saturating_sub(1) + rng.below(3) };
                m.num_clusters = n;
                m.certain.retain(|&c| c < n);
                m.maybe.retain(|&c| c < n);
                m.released.retain(|&c| c < n);
                log.lock().unwrap().after = Some(next.clone());
                settle(&mut next);
                let r = async {
                    let b = bs.open_blob(id).await?;
                    b.resize(n).await
                }
                .await;
                r.map_err(|e| e.to_string())
            }
            3 | 4 => {
                let id = pick(&mut rng);
                let m = next.get_mut(&id).unwrap();
                if !m.thin || m.num_clusters == 0 {
                    continue;
                }
                let c = rng.below(m.num_clusters);
                let allocated = m.certain.contains(&c) || m.maybe.contains(&c);
                if allocated && rng.chance(1, 2) {
                    // A whole-cluster unmap gives it back: gone once a flush follows.
                    m.certain.remove(&c);
                    m.maybe.remove(&c);
                    m.released.insert(c);
                    log.lock().unwrap().after = Some(next.clone());
                    let r = async {
                        let b = bs.open_blob(id).await?;
                        let start = b.map().start(c).expect("the model says it is allocated");
                        let free = bs.free_clusters();
                        let released = b.release_cluster(c, start).await?.expect("a thin blob's own cluster");
                        assert_eq!(b.map().start(c), None, "the map entry is cleared");
                        assert_eq!(bs.free_clusters(), free, "not free until it drained");
                        bs.reclaim_cluster(released).await;
                        assert_eq!(bs.free_clusters(), free + 1, "free once reclaimed");
                        Ok::<(), ferrite_blob::store::BsError>(())
                    }
                    .await;
                    r.map_err(|e| e.to_string())
                } else {
                    if !m.certain.contains(&c) {
                        m.maybe.insert(c);
                    }
                    m.released.remove(&c);
                    log.lock().unwrap().after = Some(next.clone());
                    let r = async {
                        let b = bs.open_blob(id).await?;
                        b.allocate_cluster(c).await.map(|_| ())
                    }
                    .await;
                    r.map_err(|e| e.to_string())
                }
            }
            5 => {
                let id = pick(&mut rng);
                let tag = format!("t{}", rng.below(1 << 20)).into_bytes();
                next.get_mut(&id).unwrap().tag = Some(tag.clone());
                log.lock().unwrap().after = Some(next.clone());
                settle(&mut next);
                let r = async {
                    let b = bs.open_blob(id).await?;
                    b.set_xattr("tag", &tag)?;
                    b.sync_md().await
                }
                .await;
                r.map_err(|e| e.to_string())
            }
            _ => {
                if rng.chance(1, 2) {
                    log.lock().unwrap().after = Some(next.clone());
                    settle(&mut next);
                    let r = bs.dev().flush().await;
                    r.map_err(|e| e.to_string())
                } else {
                    let id = pick(&mut rng);
                    next.remove(&id);
                    log.lock().unwrap().after = Some(next.clone());
                    settle(&mut next);
                    let r = bs.delete_blob(id).await;
                    r.map_err(|e| e.to_string())
                }
            }
        };
        if std::env::var("SIM_VERBOSE").is_ok() {
            println!("  op {op}: {res:?}; model now {next:?}");
        }
        if res.is_err() {
            return; // the power is out
        }
        model = next;
        let mut l = log.lock().unwrap();
        l.done = model.clone();
        l.before = None;
        l.after = None;
        l.creating = None;
        l.ops += 1;
    }
}

/// A recovered blob: size in clusters, thin, its `tag` xattr, its allocated clusters.
type RecoveredBlob = (u64, bool, Option<Vec<u8>>, Vec<u64>);

/// The recovered blobs by id.
type Recovered = std::collections::BTreeMap<u64, RecoveredBlob>;

/// What the recovered blobstore holds, blob by blob.
async fn recovered(bs: &Blobstore) -> Recovered {
    let mut out = Recovered::new();
    for id in bs.blob_ids() {
        let b = bs.open_blob(id).await.unwrap_or_else(|e| panic!("recovered blob {id:#x} does not open: {e}"));
        let md = b.md();
        let allocated: Vec<u64> =
            md.clusters.iter().enumerate().filter(|(_, &c)| c != 0).map(|(i, _)| i as u64).collect();
        out.insert(id, (md.num_clusters, md.is_thin_provisioned(), b.xattr("tag"), allocated));
    }
    out
}

fn matches(m: &ModelBlob, got: &RecoveredBlob) -> Result<(), String> {
    let (n, thin, tag, allocated) = got;
    if *n != m.num_clusters || *thin != m.thin || *tag != m.tag {
        return Err(format!("size/thin/tag {:?} vs model {m:?}", (n, thin, tag)));
    }
    if !m.thin {
        return if allocated.len() as u64 == m.num_clusters {
            Ok(())
        } else {
            Err("a thick blob lost clusters".into())
        };
    }
    let a: std::collections::BTreeSet<u64> = allocated.iter().copied().collect();
    if !m.certain.is_subset(&a) {
        return Err(format!("flushed allocations lost: {:?} not all in {a:?}", m.certain));
    }
    if !a.iter().all(|c| m.certain.contains(c) || m.maybe.contains(c) || m.released.contains(c)) {
        return Err(format!(
            "allocations nobody made: {a:?} vs {:?} + {:?} + released {:?}",
            m.certain, m.maybe, m.released
        ));
    }
    Ok(())
}

/// Does the recovered state fit `model` (plus possibly one blob being created)?
fn fits(model: &Model, creating: Option<&ModelBlob>, got: &Recovered) -> Result<(), String> {
    for (id, m) in model {
        let g = got.get(id).ok_or_else(|| format!("blob {id:#x} is gone"))?;
        matches(m, g).map_err(|e| format!("blob {id:#x}: {e}"))?;
    }
    let extra: Vec<&u64> = got.keys().filter(|id| !model.contains_key(id)).collect();
    match (extra.as_slice(), creating) {
        ([], _) => Ok(()),
        ([id], Some(c)) => matches(c, &got[id]).map_err(|e| format!("blob {id:#x} being created: {e}")),
        _ => Err(format!("blobs nobody created: {extra:?}")),
    }
}

/// Runs the workload of `seed` on a fresh crash disk, cut at its `cut`-th write or flush if
/// given; returns the disk, the log and how many writes and flushes it saw.
fn run_workload(
    sim: &mut Sim,
    seed: u64,
    name: &str,
    cut: Option<u64>,
) -> (CrashDisk, std::sync::Arc<std::sync::Mutex<Log>>) {
    let disk: CrashDisk = sim.on(0, || crash_disk::create(name, BLOCK, vec![0; 32 * MIB])).unwrap();
    if let Some(n) = cut {
        let mut rng = ferrite_reactor::SimRng::new(seed.wrapping_mul(31) + 7);
        disk.crash_at(n, move |k| rng.below(k as u64 + 1) as usize);
    }
    let log = std::sync::Arc::new(std::sync::Mutex::new(Log::default()));
    let (l2, n2) = (log.clone(), name.to_string());
    let ops = 5 + (seed % 40);
    let rx = sim.engine().run_async(0, move || async move {
        let o = StoreOpts { num_md_pages: Some(64), ..opts() };
        if let Ok(bs) = Blobstore::init(open_dev(&n2), &o).await {
            workload(bs, seed, ops, l2).await;
        }
    });
    let _ = sim.block_on(rx, MAX_STEPS);
    sim.run_until_idle(MAX_STEPS);
    (disk, log)
}

fn crash_run(seed: u64) -> u64 {
    let mut sim = Sim::new(seed, 1).unwrap();
    // A run without a cut counts the writes and flushes; the cut falls on one of them.
    let (dry, _) = run_workload(&mut sim, seed, &format!("dry{seed}"), None);
    let events = dry.counts().writes + dry.counts().flushes;
    let cut = 1 + sim.rng().below(events);
    let (disk, log) = run_workload(&mut sim, seed, &format!("C{seed}"), Some(cut));
    assert!(disk.crashed(), "seed {seed}: the cut at {cut} of {events} happened");
    let img = disk.image();
    if img[..8] != *b"SPDKBLOB" {
        return 0; // the power went before the blobstore's creation reached the medium
    }
    // Recovery on a fresh disk with what survived.
    let rname = format!("R{seed}");
    let rdisk = sim.on(0, || crash_disk::create(&rname, BLOCK, img)).unwrap();
    let rx = sim.engine().run_async(0, move || async move {
        let bs = Blobstore::load(open_dev(&rname), Some("BLOBTEST")).await.expect("the crashed blobstore loads");
        recovered(&bs).await
    });
    let got = sim.block_on(rx, MAX_STEPS).unwrap();
    // The recovered image is consistent (masks rebuilt, nothing leaked or shared).
    check_image(&rdisk.current_image(), &format!("seed {seed}: after recovery"));
    let l = log.lock().unwrap();
    if std::env::var("SIM_VERBOSE").is_ok() {
        println!(
            "seed {seed}: cut at {cut} of {events} writes/flushes, {} operations done, mid-operation {}",
            l.ops,
            l.before.is_some()
        );
    }
    // Between operations: exactly what completed. Mid-operation: the state either side of it
    // (a blob being created may be there or not).
    let ok_done = fits(&l.done, None, &got);
    let ok_before = l.before.as_ref().map(|b| fits(b, None, &got));
    let with_op = l.after.as_ref().map(|a| fits(a, l.creating.as_ref(), &got));
    if ok_done.is_err() && !matches!(ok_before, Some(Ok(()))) && !matches!(with_op, Some(Ok(()))) {
        panic!(
            "seed {seed}: after {} operations the recovered blobstore fits neither state:\n  done: {:?}\n  before: {:?}\n  with the operation: {:?}\n  got: {got:?}",
            l.ops, ok_done, ok_before, with_op
        );
    }
    l.ops
}

#[test]
fn power_cuts_during_metadata_operations_lose_nothing_that_completed() {
    let total = for_seeds(200, crash_run);
    assert!(total > 0, "no operation completed before the crashes");
    println!("{total} operations completed before the power cuts");
}

/// A delete unmaps its blob's clusters before it hands them back: a blob made meanwhile (which
/// may get them) keeps what it wrote. And a create while a delete runs never reuses the id
/// being deleted.
fn delete_vs_create(seed: u64) {
    let mut sim = Sim::new(seed, 1).unwrap();
    let name = format!("DC{seed}");
    sim.on(0, || crash_disk::create(&name, BLOCK, vec![0; 32 * MIB])).unwrap();
    let rx = sim.engine().run_async(0, move || async move {
        let o = StoreOpts { num_md_pages: Some(64), ..opts() };
        let bs = Blobstore::init(open_dev(&name), &o).await.unwrap();
        let a = bs.create_blob(&BlobOpts { num_clusters: 20, ..Default::default() }).await.unwrap();
        let free_before = bs.free_clusters();
        let bs2 = bs.clone();
        let done = std::rc::Rc::new(std::cell::Cell::new(false));
        let d2 = done.clone();
        let deleting = ferrite_reactor::spawn_local(async move {
            bs2.delete_blob(a).await.unwrap();
            d2.set(true);
        });
        // Creates race the delete until one gets enough clusters (only the deleted blob's).
        let b = loop {
            match bs.create_blob(&BlobOpts { num_clusters: free_before + 20, ..Default::default() }).await {
                Ok(id) => break id,
                // Yield once (the next turn), so the delete's I/O goes on meanwhile.
                Err(_) => {
                    let mut once = false;
                    std::future::poll_fn(|cx| {
                        if std::mem::replace(&mut once, true) {
                            std::task::Poll::Ready(())
                        } else {
                            cx.waker().wake_by_ref();
                            std::task::Poll::Pending
                        }
                    })
                    .await
                }
            }
        };
        if !done.get() {
            assert_ne!(b, a, "the id still being deleted was reused");
        }
        if std::env::var("SIM_VERBOSE").is_ok() {
            println!("seed: b created with the delete done: {}", done.get());
        }
        let blob = bs.open_blob(b).await.unwrap();
        let starts: Vec<u64> = blob.map().starts();
        let pattern = vec![0x5au8; MIB];
        // Last cluster first: the delete unmaps in cluster order.
        for &s in starts.iter().rev() {
            bs.dev().write(s * BLOCK as u64, &pattern).await.unwrap();
        }
        deleting.await;
        for &s in &starts {
            let got = bs.dev().read(s * BLOCK as u64, MIB).await.unwrap();
            assert!(got.iter().all(|&x| x == 0x5a), "blob {b:#x}: cluster at block {s} lost its data to the delete");
        }
    });
    sim.block_on(rx, MAX_STEPS).unwrap();
}

#[test]
fn a_delete_never_unmaps_clusters_it_handed_back() {
    for_seeds(30, |seed| {
        delete_vs_create(seed);
        0
    });
}
