//! Deterministic simulation of the nexus (TigerBeetle-style, on `ferrite_reactor::Sim`): two
//! reactors on one thread in an order a seed decides, on a simulated clock. Three children, each
//! a crash disk (a volatile write cache whose power a test cuts: unflushed writes lost or kept
//! block by block, a write in flight torn) under an error bdev (failures and stalls on demand).
//! Lanes on both reactors write, flush and read back blocks they own while a chaos task, one
//! event at a time, makes a child fail its I/O, stall (its I/O held, then let go), or lose its
//! power at a crash point the seed chooses and come back with what survived; the child is then
//! brought back with `nexus_online_child` (a partial rebuild). Every few events the nexus itself
//! is made again from the health store while a child is out, after a clean restart or a crash of
//! its node (writes in flight left on one child only, no clean record): it must be reassembled
//! from the children the store knows as current only, and after a crash from one of them, the
//! others rebuilt from it, so that a block written at the crash reads the same every time.
//!
//! Checked for every seed: every I/O succeeds (a healthy child is always left); every read
//! returns the last acknowledged write of its blocks (no acknowledged write is lost, no stale
//! child is read); every rebuild's source was healthy; at the end every child holds the same
//! bytes, those of the model. `SIM_SEEDS=<n>` runs more seeds (200 by default), `SIM_SEED=<n>`
//! replays one.

use ferrite_bdev::{Bdev, BdevDesc, IoRequest, IoStatus};
use ferrite_modules::error::{self, ErrorType, Injection};
use ferrite_nexus::nexus::{self, CreateOpts, Nexus};
use ferrite_nexus::store::Store;
use ferrite_reactor::sim::{for_seeds, SimRng};
use ferrite_reactor::{alloc_buf, sleep, spawn_local, Sim};
use ferrite_rpc::{Ctx, Registry};
use ferrite_testkit::crash_disk::{self, CrashDisk};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const BS: u32 = 512;
/// 8 MiB: eight segments of the nexus's log.
const BLOCKS: u64 = 16384;
/// Blocks a lane owns in a row; chunk c belongs to lane c % LANES.
const CHUNK: u64 = 64;
const LANES_PER_CORE: u64 = 2;
const CORES: usize = 2;
const LANES: u64 = LANES_PER_CORE * CORES as u64;
const CHILDREN: usize = 3;
const EVENTS: u64 = 6;
const MAX_STEPS: u64 = 5_000_000;
const UUID: &str = "0d5c7b3e-1a2b-4c3d-8e9f-a0b1c2d3e4f5";

fn uri(i: usize) -> String {
    format!("bdev:///EE_D{i}")
}

/// Block `b`'s bytes at `version` (0: never written, zeroes).
fn block_bytes(b: u64, version: u64) -> Vec<u8> {
    if version == 0 {
        return vec![0; BS as usize];
    }
    let mut v = Vec::with_capacity(BS as usize);
    while v.len() < BS as usize {
        v.extend_from_slice(&b.to_le_bytes());
        v.extend_from_slice(&version.to_le_bytes());
    }
    v
}

/// The version a block's bytes hold (None: neither zeroes nor a version of this block).
fn version_of(b: u64, bytes: &[u8]) -> Option<u64> {
    if bytes.iter().all(|&x| x == 0) {
        return Some(0);
    }
    let v = u64::from_le_bytes(bytes[8..16].try_into().unwrap());
    (block_bytes(b, v) == bytes).then_some(v)
}

/// What the lanes and the chaos share.
#[derive(Default)]
struct Shared {
    /// The chaos is over: lanes finish with a full check.
    done: AtomicBool,
    /// The nexus is being made again: lanes let go of it and wait.
    pause: AtomicBool,
    /// Lanes that let go while paused.
    parked: AtomicUsize,
    /// Bumped each time the nexus is made again (lanes open it anew).
    epoch: AtomicUsize,
    /// Failures seen (I/O that did not succeed, reads that returned something else).
    errors: Mutex<Vec<String>>,
    /// Block -> last acknowledged version (each block has one lane writing it).
    model: Mutex<HashMap<u64, u64>>,
    /// Block -> the version of a write in flight when the nexus's node crashed, which reached
    /// some child only: a read may return it or the model's, and whichever it returns first
    /// is what every later read must return (the block may not flip).
    torn: Mutex<HashMap<u64, u64>>,
    /// I/Os done.
    ios: AtomicUsize,
    /// The chaos event under way.
    event: AtomicUsize,
    /// The children's disks (for what each holds when a check fails).
    disks: Mutex<Option<Arc<Mutex<Vec<CrashDisk>>>>>,
}

impl Shared {
    fn error(&self, e: String) {
        let e = format!(
            "[event {}, children {:?}] {e}",
            self.event.load(Ordering::SeqCst),
            nexus::find("NX").map(|n| states(&n))
        );
        let mut v = self.errors.lock().unwrap();
        if v.len() < 20 {
            v.push(e);
        }
    }
}

fn open_nexus() -> Option<BdevDesc> {
    Bdev::open_ext("NX", true, |_| {}).ok()
}

async fn lane(core: u64, lane: u64, seed: u64, sh: Arc<Shared>) {
    let id = core * LANES_PER_CORE + lane;
    let mut rng = SimRng::new(seed ^ (id + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let chunks: Vec<u64> = (0..BLOCKS / CHUNK).filter(|c| c % LANES == id).collect();
    let mut version = 0u64;
    let mut current = chunks[rng.below(chunks.len() as u64) as usize];
    'epochs: loop {
        let epoch = sh.epoch.load(Ordering::SeqCst);
        let Some(desc) = open_nexus() else {
            sleep(Duration::from_millis(1)).await;
            continue;
        };
        let ch = desc.channel().expect("a channel");
        loop {
            if sh.pause.load(Ordering::SeqCst) || sh.epoch.load(Ordering::SeqCst) != epoch {
                drop(ch);
                drop(desc);
                sh.parked.fetch_add(1, Ordering::SeqCst);
                while sh.pause.load(Ordering::SeqCst) {
                    sleep(Duration::from_millis(1)).await;
                }
                sh.parked.fetch_sub(1, Ordering::SeqCst);
                continue 'epochs;
            }
            let done = sh.done.load(Ordering::SeqCst);
            // A host's pace, on the simulated clock (else the lanes would swamp the events).
            sleep(Duration::from_micros(50 + rng.below(400))).await;
            // A write of 1 to 8 blocks inside one of its chunks, a flush now and then, and a
            // read back of the range (or, at the end, of every chunk it owns).
            // A lane keeps to one chunk for a while (a host's working set), so that while a
            // child is out only some segments are written and a partial rebuild copies a part.
            if rng.chance(1, 32) {
                current = chunks[rng.below(chunks.len() as u64) as usize];
            }
            let c = current;
            let n = 1 + rng.below(8);
            let first = c * CHUNK + rng.below(CHUNK - n + 1);
            if !done {
                version += 1;
                let v = (id << 48) | version;
                let mut buf = alloc_buf((n * BS as u64) as usize);
                for (i, b) in (first..first + n).enumerate() {
                    buf[i * BS as usize..(i + 1) * BS as usize].copy_from_slice(&block_bytes(b, v));
                }
                let r = ch.submit_wait(IoRequest::write(first, n, buf)).await;
                sh.ios.fetch_add(1, Ordering::Relaxed);
                if r.status != IoStatus::Success {
                    sh.error(format!("write of blocks {first}+{n}: {:?}", r.status));
                    return;
                }
                {
                    let mut m = sh.model.lock().unwrap();
                    let mut t = sh.torn.lock().unwrap();
                    for b in first..first + n {
                        m.insert(b, v);
                        t.remove(&b);
                    }
                }
                if rng.chance(1, 4) {
                    let r = ch.submit_wait(IoRequest::no_payload(ferrite_bdev::IoType::Flush, 0, BLOCKS)).await;
                    if r.status != IoStatus::Success {
                        sh.error(format!("flush: {:?}", r.status));
                        return;
                    }
                }
            }
            let ranges: Vec<(u64, u64)> =
                if done { chunks.iter().map(|c| (c * CHUNK, CHUNK)).collect() } else { vec![(first, n)] };
            for (first, n) in ranges {
                let r = ch.submit_wait(IoRequest::read(first, n, alloc_buf((n * BS as u64) as usize))).await;
                sh.ios.fetch_add(1, Ordering::Relaxed);
                if r.status != IoStatus::Success {
                    sh.error(format!("read of blocks {first}+{n}: {:?}", r.status));
                    return;
                }
                let data: Vec<u8> = r.req.bufs.iter().flat_map(|b| b.iter().copied()).collect();
                let mut m = sh.model.lock().unwrap();
                for (i, b) in (first..first + n).enumerate() {
                    let got = version_of(b, &data[i * BS as usize..(i + 1) * BS as usize]);
                    // A torn block settles on what it is first read as.
                    if let Some(t) = sh.torn.lock().unwrap().remove(&b) {
                        if got == Some(t) {
                            m.insert(b, t);
                        }
                    }
                    let want = m.get(&b).copied().unwrap_or(0);
                    if got != Some(want) {
                        drop(m);
                        let held: Vec<Option<u64>> = sh.disks.lock().unwrap().as_ref().map_or(vec![], |d| {
                            d.lock()
                                .unwrap()
                                .iter()
                                .map(|d| {
                                    let img = d.current_image();
                                    let at = (b * BS as u64) as usize;
                                    version_of(b, &img[at..at + BS as usize])
                                })
                                .collect()
                        });
                        sh.error(format!("block {b}: read version {got:?}, the last acknowledged write was {want}; the children hold {held:?}"));
                        return;
                    }
                }
            }
            if done {
                return;
            }
        }
    }
}

fn opts(seed: u64) -> CreateOpts {
    CreateOpts {
        name: "NX".into(),
        uuid: Some(UUID.parse().unwrap()),
        size: 0,
        children: (0..CHILDREN).map(uri).collect(),
        resv_key: 0,
        preempt_key: 0,
        resv_type: 5,
        local_first: false,
        store: Some(Store::Memory(format!("sim-{seed}-{}", std::process::id()))),
        rebuild_window_kb: 64,
        rebuild_max_mb_sec: 0,
        auto_online_ms: 0,
    }
}

fn ctx() -> Ctx {
    Ctx { engine: ferrite_reactor::engine(), registry: Arc::new(Registry::default()) }
}

fn states(n: &Nexus) -> Vec<String> {
    let info = n.info();
    info["children"].as_array().unwrap().iter().map(|c| c["state"].as_str().unwrap().to_string()).collect()
}

/// Waits until child `i` is in `state`; false after 30 s (simulated) or once a lane failed.
async fn wait_state(i: usize, state: &str, sh: &Shared) -> bool {
    for k in 0..30_000 {
        if k % 1000 == 999 && std::env::var("SIM_VERBOSE").is_ok() {
            eprintln!(
                "waiting for child {i} {state}: {:?} ios {}",
                nexus::find("NX").map(|n| states(&n)),
                sh.ios.load(Ordering::Relaxed)
            );
        }
        if let Some(n) = nexus::find("NX") {
            if states(&n)[i] == state {
                return true;
            }
        }
        if !sh.errors.lock().unwrap().is_empty() {
            return false;
        }
        sleep(Duration::from_millis(1)).await;
    }
    sh.error(format!("child {i} is not {state} after 30 s: {:?}", nexus::find("NX").map(|n| n.info())));
    false
}

fn make_child(i: usize, image: Vec<u8>) -> CrashDisk {
    let d = crash_disk::create(&format!("D{i}"), BS, image).expect("crash disk");
    error::create(&format!("D{i}"), None).expect("error bdev");
    d
}

/// The chaos: one event at a time, each ending with every child healthy again.
async fn chaos(seed: u64, disks: Arc<Mutex<Vec<CrashDisk>>>, sh: Arc<Shared>) -> Vec<String> {
    let mut rng = SimRng::new(seed.wrapping_mul(31) + 7);
    let mut log = Vec::new();
    let ctx = ctx();
    for ev in 0..EVENTS {
        sleep(Duration::from_millis(1 + rng.below(20))).await;
        let i = rng.below(CHILDREN as u64) as usize;
        let ee = format!("EE_D{i}");
        let kind = rng.below(3);
        sh.event.store(ev as usize, Ordering::SeqCst);
        if std::env::var("SIM_VERBOSE").is_ok() {
            eprintln!("event {ev}: kind {kind} child {i}; states {:?}", nexus::find("NX").map(|n| states(&n)));
        }
        match kind {
            0 => {
                log.push(format!("{ev}: child {i} fails a write"));
                error::inject(&ee, Some(ferrite_bdev::IoType::Write), Injection::of(ErrorType::Failure, 1)).unwrap();
                if !wait_state(i, "faulted", &sh).await {
                    break;
                }
                error::clear(&ee).unwrap();
            }
            1 => {
                let ms = 1 + rng.below(30);
                log.push(format!("{ev}: child {i} stalls for {ms} ms"));
                error::inject(&ee, None, Injection::of(ErrorType::Pending, u32::MAX)).unwrap();
                sleep(Duration::from_millis(ms)).await;
                let id = error::disarm_pending(&ee).unwrap();
                let _ = ferrite_reactor::engine().on_all(move |_| error::resume_pending_here(id)).await;
                continue;
            }
            _ => {
                let at = rng.below(30);
                log.push(format!("{ev}: child {i} loses its power at its {at}th write or flush"));
                let mut crng = SimRng::new(rng.next_u64());
                disks.lock().unwrap()[i].crash_at(at, move |n| crng.below(n as u64 + 1) as usize);
                if !wait_state(i, "faulted", &sh).await {
                    break;
                }
                let image = disks.lock().unwrap()[i].image();
                let gone = ferrite_bdev::unregister(&format!("D{i}"), None).expect("unregister");
                let _ = gone.await;
                while ferrite_bdev::lookup(&ee).is_some() {
                    sleep(Duration::from_millis(1)).await;
                }
                sleep(Duration::from_millis(5)).await;
                let d = make_child(i, image);
                disks.lock().unwrap()[i] = d;
            }
        }
        // The nexus's node goes down now and then while the child is out, and the nexus is
        // made again from the store: a clean restart, or a crash that leaves writes in flight
        // on some children only and the store without a clean record.
        if rng.chance(1, 3) {
            let crash = rng.chance(1, 2);
            log.push(format!(
                "{ev}: the nexus is made again from the store ({})",
                if crash { "after a crash" } else { "clean" }
            ));
            sh.pause.store(true, Ordering::SeqCst);
            while sh.parked.load(Ordering::SeqCst) < LANES as usize {
                if !sh.errors.lock().unwrap().is_empty() {
                    break;
                }
                sleep(Duration::from_millis(1)).await;
            }
            if !sh.errors.lock().unwrap().is_empty() {
                sh.pause.store(false, Ordering::SeqCst);
                break;
            }
            nexus::destroy(&ctx, "NX").await.expect("destroy");
            if crash {
                let (j, torn) = tear(&mut rng, i, seed, &sh).await;
                log.push(format!("{ev}: writes in flight reached child {j} only: blocks {torn:?}"));
            }
            let n = nexus::create(&ctx, opts(seed)).await.expect("create again");
            let st = states(&n);
            if st[i] == "online" {
                sh.error(format!("after the restart the stale child {i} is {st:?}"));
            }
            let online = st.iter().filter(|s| *s == "online").count();
            if crash && online != 1 {
                sh.error(format!("after a crash one child is the reference, the others are rebuilt: {st:?}"));
            }
            sh.epoch.fetch_add(1, Ordering::SeqCst);
            sh.pause.store(false, Ordering::SeqCst);
        } else {
            nexus::online_child(&ctx, "NX", &uri(i)).await.expect("online");
        }
        if !wait_state(i, "online", &sh).await {
            break;
        }
        let n = nexus::find("NX").unwrap();
        let job = ferrite_nexus::rebuild::job(&n, &uri(i)).expect("a rebuild ran");
        // The job ends just after its child turned healthy.
        while job.stats()["state"] == "running" {
            sleep(Duration::from_millis(1)).await;
        }
        let s = job.stats();
        if s["source"] == uri(i).as_str() || s["state"] != "completed" {
            sh.error(format!("child {i}'s rebuild: {s}"));
        }
        // Every child is healthy again before the next event (after a crash, those rebuilt
        // from the reference too).
        for k in 0..CHILDREN {
            if !wait_state(k, "online", &sh).await {
                break;
            }
        }
    }
    sh.done.store(true, Ordering::SeqCst);
    log
}

/// The crash of the nexus's node, on children already released: writes that were in flight
/// reached one healthy child (not `stale`) only, at a few blocks; the store loses its clean
/// record. Returns the child and the blocks.
async fn tear(rng: &mut SimRng, stale: usize, seed: u64, sh: &Shared) -> (usize, Vec<u64>) {
    let mut j = rng.below(CHILDREN as u64) as usize;
    if j == stale {
        j = (j + 1) % CHILDREN;
    }
    let desc = Bdev::open_ext(&format!("EE_D{j}"), true, |_| {}).expect("open a released child");
    let ch = desc.channel().expect("a channel");
    let mut blocks = Vec::new();
    for k in 0..1 + rng.below(4) {
        let b = rng.below(BLOCKS);
        // A version no lane writes (lanes' carry their id in bits 48 and up, ids < LANES).
        let v = (0xff << 48) | (sh.event.load(Ordering::SeqCst) as u64) << 8 | k;
        write_block(&ch, b, v).await;
        sh.torn.lock().unwrap().insert(b, v);
        blocks.push(b);
    }
    // On the medium: the old nexus's record of unflushed segments is gone with it, and a
    // later power cut of this child must not take back what a read may have settled on.
    let r = ch.submit_wait(IoRequest::no_payload(ferrite_bdev::IoType::Flush, 0, BLOCKS)).await;
    assert_eq!(r.status, IoStatus::Success, "flush of the torn writes");
    drop(ch);
    drop(desc);
    let store = opts(seed).store.expect("a store");
    let key = ferrite_nexus::store::key(&UUID.parse().unwrap());
    let mut rec = store.get(&key).expect("store").expect("a record");
    rec.clean_shutdown = false;
    store.put(&key, &rec).expect("store");
    (j, blocks)
}

fn run(seed: u64) -> u64 {
    let mut sim = Sim::new(seed, CORES).unwrap();
    let disks =
        sim.on(0, || (0..CHILDREN).map(|i| make_child(i, vec![0; (BLOCKS * BS as u64) as usize])).collect::<Vec<_>>());
    let rx = sim.engine().run_async(0, move || async move {
        nexus::create(&ctx(), opts(seed)).await.expect("create");
    });
    sim.block_on(rx, MAX_STEPS).unwrap();
    let sh = Arc::new(Shared::default());
    let mut lanes = Vec::new();
    for core in 0..CORES {
        let sh = sh.clone();
        lanes.push(sim.engine().run_async(core, move || async move {
            let ts: Vec<_> = (0..LANES_PER_CORE).map(|l| spawn_local(lane(core as u64, l, seed, sh.clone()))).collect();
            for t in ts {
                t.await;
            }
        }));
    }
    let disks = Arc::new(Mutex::new(disks));
    *sh.disks.lock().unwrap() = Some(disks.clone());
    let (d2, sh2) = (disks.clone(), sh.clone());
    let chaos_rx = sim.engine().run_async(0, move || chaos(seed, d2, sh2));
    let log = sim.block_on(chaos_rx, MAX_STEPS).unwrap_or_else(|_| panic!("seed {seed}: the chaos hung"));
    for l in lanes {
        sim.block_on(l, MAX_STEPS).unwrap_or_else(|_| panic!("seed {seed}: a lane hung; {log:?}"));
    }
    let errors = sh.errors.lock().unwrap().clone();
    assert!(errors.is_empty(), "seed {seed}: {errors:?}\nevents: {log:?}");
    // Every child holds the same bytes: the model's.
    let images: Vec<Vec<u8>> = disks.lock().unwrap().iter().map(|d| d.current_image()).collect();
    let model = sh.model.lock().unwrap().clone();
    for (i, img) in images.iter().enumerate() {
        for b in 0..BLOCKS {
            let at = (b * BS as u64) as usize;
            let want = model.get(&b).copied().unwrap_or(0);
            let got = version_of(b, &img[at..at + BS as usize]);
            assert_eq!(got, Some(want), "seed {seed}: child {i} block {b}\nevents: {log:?}");
        }
    }
    let rx = sim.engine().run_async(0, || async { nexus::destroy(&ctx(), "NX").await.expect("destroy") });
    sim.block_on(rx, MAX_STEPS).unwrap();
    if std::env::var("SIM_VERBOSE").is_ok() {
        eprintln!(
            "seed {seed}: {} steps, {:?} simulated, {} I/Os; {log:?}",
            sim.steps(),
            sim.elapsed(),
            sh.ios.load(Ordering::Relaxed)
        );
    }
    sh.ios.load(Ordering::Relaxed) as u64
}

#[test]
fn no_acknowledged_write_is_lost_and_no_stale_child_is_read() {
    let ios = for_seeds(200, run);
    assert!(ios > 0);
}

async fn write_block(ch: &ferrite_bdev::IoChannel, b: u64, v: u64) {
    let mut buf = alloc_buf(BS as usize);
    buf.copy_from_slice(&block_bytes(b, v));
    let r = ch.submit_wait(IoRequest::write(b, 1, buf)).await;
    assert_eq!(r.status, IoStatus::Success, "write of block {b}");
}

async fn read_block(ch: &ferrite_bdev::IoChannel, b: u64) -> Option<u64> {
    let r = ch.submit_wait(IoRequest::read(b, 1, alloc_buf(BS as usize))).await;
    assert_eq!(r.status, IoStatus::Success, "read of block {b}");
    let data: Vec<u8> = r.req.bufs.iter().flat_map(|b| b.iter().copied()).collect();
    version_of(b, &data)
}

/// The case the random one finds only now and then, every time: a child whose power is cut
/// loses writes it acknowledged but had not flushed, in segments nobody writes while it is
/// out. Its partial rebuild must copy those segments too (the nexus keeps the segments written
/// since the last flush every child took); read from it alone afterwards, every acknowledged
/// write is there.
#[test]
fn a_child_that_lost_its_cache_is_rebuilt_where_it_lost_writes() {
    for_seeds(10, |seed| {
        let mut sim = Sim::new(seed, CORES).unwrap();
        let disks = sim
            .on(0, || (0..CHILDREN).map(|i| make_child(i, vec![0; (BLOCKS * BS as u64) as usize])).collect::<Vec<_>>());
        let disks = Arc::new(Mutex::new(disks));
        let d2 = disks.clone();
        let rx = sim.engine().run_async(0, move || async move {
            let ctx = ctx();
            let mut o = opts(seed);
            o.store = Some(Store::Memory(format!("lost-{seed}-{}", std::process::id())));
            nexus::create(&ctx, o).await.expect("create");
            let desc = open_nexus().expect("open");
            let ch = desc.channel().unwrap();
            write_block(&ch, 100, 1).await;
            let r = ch.submit_wait(IoRequest::no_payload(ferrite_bdev::IoType::Flush, 0, BLOCKS)).await;
            assert_eq!(r.status, IoStatus::Success);
            // Acknowledged, not flushed: in every child's cache.
            write_block(&ch, 100, 2).await;
            write_block(&ch, 5000, 2).await;
            // Child 1 loses its power and all it had not flushed.
            d2.lock().unwrap()[1].crash(|_| 0);
            write_block(&ch, 9000, 3).await;
            let n = nexus::find("NX").unwrap();
            assert_eq!(states(&n)[1], "faulted", "{}", n.info());
            let image = d2.lock().unwrap()[1].image();
            let _ = ferrite_bdev::unregister("D1", None).expect("unregister").await;
            while ferrite_bdev::lookup("EE_D1").is_some() {
                sleep(Duration::from_millis(1)).await;
            }
            sleep(Duration::from_millis(5)).await;
            let d = make_child(1, image);
            d2.lock().unwrap()[1] = d;
            nexus::online_child(&ctx, "NX", &uri(1)).await.expect("online");
            let job = ferrite_nexus::rebuild::job(&n, &uri(1)).unwrap();
            while job.stats()["state"] == "running" {
                sleep(Duration::from_millis(1)).await;
            }
            let s = job.stats();
            assert_eq!((s["state"].as_str(), s["is_partial"].as_bool()), (Some("completed"), Some(true)), "{s}");
            assert!(s["blocks_total"].as_u64().unwrap() < BLOCKS, "a partial rebuild copies a part: {s}");
            // Reads from child 1 alone.
            for i in [0, 2] {
                nexus::fault_child("NX", &uri(i)).await.expect("fault");
            }
            let got = (read_block(&ch, 100).await, read_block(&ch, 5000).await, read_block(&ch, 9000).await);
            assert_eq!(got, (Some(2), Some(2), Some(3)), "what the rebuilt child serves");
            drop(ch);
            drop(desc);
            nexus::destroy(&ctx, "NX").await.expect("destroy");
        });
        sim.block_on(rx, MAX_STEPS).unwrap();
        1
    });
}
