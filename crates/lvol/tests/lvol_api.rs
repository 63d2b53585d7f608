//! The lvol crate on its own, in-process over a malloc bdev (no daemon, no RPC): thin lvols,
//! snapshots and clones, the space an unmap gives back, inflate, and an lvstore unloaded and
//! loaded again with its data. The daemon-level tests (RPCs, real clients, kill -9) are in
//! crates/ferrite/tests/lvol.rs.

use ferrite_bdev::{Bdev, IoChannel, IoRequest, IoStatus, IoType};
use ferrite_blob::store::InitClear;
use ferrite_lvol::lvs::{self, LvsOpts};
use ferrite_modules::malloc::{self, MallocOpts};
use ferrite_reactor::{Engine, EngineConfig, IoBuf, ReactorMode};
use std::time::Duration;

const MIB: u64 = 1 << 20;
const BS: u64 = 512;
/// Blocks per 1 MiB cluster.
const CLUSTER: u64 = MIB / BS;

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn buf(data: &[u8]) -> IoBuf {
    let mut b = IoBuf::heap(data.len());
    b.copy_from_slice(data);
    b
}

async fn write(ch: &IoChannel, lba: u64, data: &[u8]) {
    let c = ch.submit_wait(IoRequest::write(lba, data.len() as u64 / BS, buf(data))).await;
    assert_eq!(c.status, IoStatus::Success, "write at {lba}");
}

async fn read(ch: &IoChannel, lba: u64, len: usize) -> Vec<u8> {
    let c = ch.submit_wait(IoRequest::read(lba, len as u64 / BS, IoBuf::heap(len))).await;
    assert_eq!(c.status, IoStatus::Success, "read at {lba}");
    c.req.bufs.iter().flat_map(|b| b.to_vec()).collect()
}

fn channel(bdev: &str) -> (ferrite_bdev::BdevDesc, IoChannel) {
    let d = Bdev::open(bdev, true, || {}).unwrap();
    let ch = d.channel().unwrap();
    (d, ch)
}

fn run<F, Fut>(f: F) -> Fut::Output
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: std::future::Future + 'static,
    Fut::Output: Send + 'static,
{
    let e = Engine::start(EngineConfig { cores: vec![0], mode: ReactorMode::Poll, ..Default::default() }).unwrap();
    let rx = e.run_async(0, f);
    let (tx, done) = std::sync::mpsc::channel();
    std::thread::spawn(move || tx.send(rx.wait()));
    let out = done.recv_timeout(Duration::from_secs(120)).expect("the test's task ended in time").expect("no panic");
    e.stop();
    e.join();
    out
}

async fn store(base: &str, blocks: u64) -> std::sync::Arc<lvs::Lvstore> {
    malloc::create(MallocOpts {
        name: Some(base.into()),
        num_blocks: blocks,
        block_size: BS as u32,
        ..Default::default()
    })
    .unwrap();
    let o = LvsOpts {
        bdev_name: base.into(),
        lvs_name: format!("{base}_lvs"),
        cluster_sz: Some(MIB as u32),
        clear: InitClear::Unmap,
        md_pages_per_cluster_ratio: None,
    };
    lvs::create(&o).await.unwrap()
}

#[test]
fn snapshots_clones_unmap_and_inflate_keep_every_lvols_data() {
    run(|| async {
        let lvs = store("la_m", 32 * CLUSTER).await;
        let free0 = lvs.bs.free_clusters();
        let thin = lvs::create_lvol(&lvs, "thin", 4 * MIB, true, None).await.unwrap();
        assert_eq!(lvs.bs.free_clusters(), free0, "a thin lvol takes no cluster until written");
        let (_d, ch) = channel(&thin.bdev_name());
        let (a, b) = (pattern(1, MIB as usize), pattern(2, MIB as usize));
        write(&ch, 0, &a).await;
        write(&ch, 2 * CLUSTER, &b).await;
        assert_eq!(lvs.bs.free_clusters(), free0 - 2, "two clusters written, two allocated");

        // A snapshot freezes both; a clone of it diverges on its own writes only.
        let snap = lvs::snapshot_lvol(&lvs, &thin, "snap").await.unwrap();
        let clone = lvs::clone_lvol(&lvs, &snap, "clone").await.unwrap();
        let (_dc, cc) = channel(&clone.bdev_name());
        let c = pattern(3, MIB as usize);
        write(&cc, 0, &c).await;
        let (_ds, sc) = channel(&snap.bdev_name());
        assert!(read(&sc, 0, MIB as usize).await == a, "the snapshot keeps cluster 0");
        assert!(read(&cc, 0, MIB as usize).await == c, "the clone has its own cluster 0");
        assert!(read(&cc, 2 * CLUSTER, MIB as usize).await == b, "the clone reads cluster 2 through the snapshot");
        assert!(read(&ch, 0, MIB as usize).await == a, "the original reads through the snapshot too");
        let w = sc.submit_wait(IoRequest::write(0, 1, buf(&[0u8; 512]))).await;
        assert!(!w.status.is_ok(), "a snapshot refuses writes: {:?}", w.status);

        // A whole-cluster unmap gives a thin cluster back to the store when no ancestor holds
        // data there (cluster 1: the clone's alone); over a snapshot's cluster (cluster 0) the
        // clone keeps its cluster, as SPDK does, or the snapshot's data would show through.
        write(&cc, CLUSTER, &pattern(4, MIB as usize)).await;
        let before = lvs.bs.free_clusters();
        for at in [0, CLUSTER] {
            let u = cc.submit_wait(IoRequest::no_payload(IoType::Unmap, at, CLUSTER)).await;
            assert_eq!(u.status, IoStatus::Success);
        }
        for _ in 0..200 {
            if lvs.bs.free_clusters() == before + 1 {
                break;
            }
            ferrite_reactor::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(lvs.bs.free_clusters(), before + 1, "only the cluster no ancestor holds was released");
        for at in [0, CLUSTER] {
            assert!(read(&cc, at, MIB as usize).await.iter().all(|x| *x == 0), "unmapped cluster at {at} reads zeroes");
        }
        assert!(read(&sc, 0, MIB as usize).await == a, "the snapshot is untouched");

        // Inflate: the clone gets every cluster it reads, and reads the same.
        let want2 = read(&cc, 2 * CLUSTER, MIB as usize).await;
        lvs::separate_lvol(&lvs, &clone, true).await.unwrap();
        assert!(read(&cc, 2 * CLUSTER, MIB as usize).await == want2, "inflate kept the data");
        assert_eq!(want2, b);

        // Everything deleted: the store has all its clusters back.
        drop((cc, _dc, sc, _ds, ch, _d));
        for l in [clone, thin, snap] {
            lvs::delete_lvol(&lvs, l).await.unwrap();
        }
        assert_eq!(lvs.bs.free_clusters(), free0, "every cluster is free again");
        lvs::delete(&lvs).await.unwrap();
        drop(ferrite_bdev::unregister("la_m", None).unwrap());
    });
}

#[test]
fn an_unloaded_lvstore_loads_with_its_lvols_and_their_data() {
    run(|| async {
        let lvs = store("lb_m", 16 * CLUSTER).await;
        let thick = lvs::create_lvol(&lvs, "thick", 2 * MIB, false, None).await.unwrap();
        let thin = lvs::create_lvol(&lvs, "thin", 3 * MIB, true, None).await.unwrap();
        let (x, y) = (pattern(7, 4096), pattern(8, 8192));
        {
            let (_d1, c1) = channel(&thick.bdev_name());
            let (_d2, c2) = channel(&thin.bdev_name());
            write(&c1, 100, &x).await;
            write(&c2, CLUSTER + 8, &y).await;
        }
        lvs::resize_lvol(&lvs, &thin, 5 * MIB).await.unwrap();
        let (thick_id, thin_id) = (thick.uuid, thin.uuid);
        drop((thick, thin, lvs));
        lvs::shutdown().await;
        assert!(lvs::by_name("lb_m_lvs").is_none(), "unloaded");
        assert!(Bdev::open(&thin_id.to_string(), false, || {}).is_err(), "its bdevs are gone");

        let lvs = lvs::load("lb_m").await.unwrap();
        assert_eq!(*lvs.name.lock().unwrap(), "lb_m_lvs");
        let names: Vec<String> = lvs.lvols.lock().unwrap().values().map(|l| l.name.lock().unwrap().clone()).collect();
        assert!(names.contains(&"thick".to_string()) && names.contains(&"thin".to_string()), "{names:?}");
        let (_d1, c1) = channel(&thick_id.to_string());
        let (_d2, c2) = channel(&thin_id.to_string());
        assert!(read(&c1, 100, 4096).await == x, "the thick lvol's data");
        assert!(read(&c2, CLUSTER + 8, 8192).await == y, "the thin lvol's data");
        assert_eq!(c2.num_blocks(), 5 * CLUSTER, "the resize was kept");
        assert!(read(&c2, 4 * CLUSTER, 4096).await.iter().all(|b| *b == 0), "never written reads zeroes");
        drop((c1, _d1, c2, _d2));
        lvs::delete(&lvs).await.unwrap();
        drop(ferrite_bdev::unregister("lb_m", None).unwrap());
    });
}
