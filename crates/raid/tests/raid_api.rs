//! The RAID crate in-process over malloc bdevs (no daemon): every level's reads and writes land
//! where SPDK puts them and read back (raid5f's data and rotating parity, its degraded reads
//! reconstructed from parity, a member rebuilt from the others), unmaps and flushes reach the members, a raid1 survives a
//! member's removal and rebuilds one added back, and a RAID with a superblock assembles itself
//! from its members by examine (a stale member left out). The daemon-level tests are in
//! crates/ferrite/tests/raid*.rs.

use ferrite_bdev::{Bdev, IoChannel, IoRequest, IoStatus, IoType};
use ferrite_modules::malloc::{self, MallocOpts};
use ferrite_raid::level::Level;
use ferrite_raid::raid::{self, CreateOpts, State};
use ferrite_reactor::{Engine, EngineConfig, IoBuf, ReactorMode};
use std::time::Duration;

const BS: u64 = 512;

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

/// Reads a member directly (through a read-only descriptor: the RAID holds the claim).
async fn read_member(name: &str, lba: u64, len: usize) -> Vec<u8> {
    let d = Bdev::open(name, false, || {}).unwrap();
    read(&d.channel().unwrap(), lba, len).await
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

fn mallocs(names: &[&str], blocks: u64) {
    for n in names {
        malloc::create(MallocOpts {
            name: Some(n.to_string()),
            num_blocks: blocks,
            block_size: BS as u32,
            ..Default::default()
        })
        .unwrap();
    }
}

fn opts(name: &str, level: Level, members: &[&str], strip_kb: u32, sb: bool) -> CreateOpts {
    CreateOpts {
        name: name.into(),
        level,
        base_bdevs: members.iter().map(|s| s.to_string()).collect(),
        strip_size_kb: strip_kb,
        uuid: None,
        superblock: sb,
    }
}

async fn wait_examine() {
    let _ = ferrite_bdev::module::wait_for_examine().await;
}

#[test]
fn raid0_stripes_as_spdk_does() {
    run(|| async {
        ferrite_raid::register_module();
        mallocs(&["a0", "a1", "a2"], 2048);
        raid::create(opts("r0", Level::Raid0, &["a0", "a1", "a2"], 4, false)).await.unwrap();
        let r = ferrite_bdev::lookup("r0").unwrap();
        assert_eq!(r.num_blocks(), 3 * 2048, "three members of whole 8-block strips");
        let (_d, ch) = channel("r0");
        // Writes across strips and members, then every block read back and found on its member.
        let data = pattern(1, 40 * 512);
        write(&ch, 5, &data).await;
        assert_eq!(read(&ch, 5, data.len()).await, data);
        for b in 5..45u64 {
            let (s, o) = (b / 8, b % 8);
            let member = ["a0", "a1", "a2"][(s % 3) as usize];
            let on = read_member(member, (s / 3) * 8 + o, 512).await;
            let i = ((b - 5) * 512) as usize;
            assert_eq!(on, data[i..i + 512], "block {b} on {member}");
        }
        // A one-strip read is the forwarded fast path; an unmap over every member zeroes.
        assert_eq!(read(&ch, 8, 4096).await, data[3 * 512..11 * 512]);
        let c = ch.submit_wait(IoRequest::no_payload(IoType::Unmap, 6, 30)).await;
        assert_eq!(c.status, IoStatus::Success);
        let after = read(&ch, 5, data.len()).await;
        assert_eq!(after[..512], data[..512]);
        assert!(after[512..31 * 512].iter().all(|&b| b == 0), "unmapped blocks read zeroes");
        assert_eq!(after[31 * 512..], data[31 * 512..]);
        let c = ch.submit_wait(IoRequest::no_payload(IoType::Flush, 0, 0)).await;
        assert_eq!(c.status, IoStatus::Success);
        assert_eq!(raid::find("r0").unwrap().state(), State::Online);
        let e = Bdev::open("a1", true, || {}).err().expect("a claimed member is not opened for writing");
        assert!(e.to_string().contains("claim"), "{e}");
    });
}

#[test]
fn concat_and_raid1_read_back_what_they_wrote() {
    run(|| async {
        ferrite_raid::register_module();
        mallocs(&["c0", "c1", "m0", "m1"], 1024);
        raid::create(opts("cc", Level::Concat, &["c0", "c1"], 8, false)).await.unwrap();
        assert_eq!(ferrite_bdev::lookup("cc").unwrap().num_blocks(), 2048);
        let (_d, ch) = channel("cc");
        let data = pattern(2, 64 * 512);
        write(&ch, 1000, &data).await;
        assert_eq!(read(&ch, 1000, data.len()).await, data);
        assert_eq!(read_member("c1", 0, 512).await, data[24 * 512..25 * 512], "block 1024 is c1's first");
        raid::create(opts("mm", Level::Raid1, &["m0", "m1"], 0, false)).await.unwrap();
        let (_d2, ch) = channel("mm");
        write(&ch, 7, &data).await;
        for _ in 0..4 {
            assert_eq!(read(&ch, 7, data.len()).await, data);
        }
        assert_eq!(read_member("m0", 7, data.len()).await, data);
        assert_eq!(read_member("m1", 7, data.len()).await, data);
    });
}

#[test]
fn bad_creates_are_refused() {
    run(|| async {
        ferrite_raid::register_module();
        mallocs(&["b0", "b1"], 1024);
        malloc::create(MallocOpts {
            name: Some("b4k".into()),
            num_blocks: 128,
            block_size: 4096,
            ..Default::default()
        })
        .unwrap();
        let e = raid::create(opts("x", Level::Raid0, &["b0", "b1"], 3, false)).await.unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL, "{e}");
        let e = raid::create(opts("x", Level::Raid1, &["b0", "b1"], 4, false)).await.unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL, "{e}");
        let e = raid::create(opts("x", Level::Raid1, &["b0"], 0, false)).await.unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL, "{e}");
        let e = raid::create(opts("x", Level::Raid5f, &["b0", "b1"], 4, false)).await.unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL, "raid5f needs three members: {e}");
        assert!(e.to_string().contains("At least 3 base devices required for raid5f"), "{e}");
        let e = raid::create(opts("x", Level::Raid5f, &["b0", "b1", "b4k"], 0, false)).await.unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL, "raid5f needs a strip size: {e}");
        let e = raid::create(opts("x", Level::Raid0, &["b0", "b4k"], 4, false)).await.unwrap_err();
        assert_eq!(e.errno(), libc::EINVAL, "{e}");
        assert!(Bdev::open("b0", true, || {}).is_ok(), "a failed create releases its members");
        raid::create(opts("ok", Level::Raid1, &["b0", "b1"], 0, false)).await.unwrap();
        let e = raid::create(opts("x2", Level::Raid1, &["b1", "nosuch"], 0, false)).await.unwrap_err();
        assert_eq!(e.errno(), libc::EPERM, "a claimed member: {e}");
        // A missing member: configuring until it appears (SPDK's behaviour).
        raid::create(opts("wait", Level::Raid1, &["later0", "later1"], 0, false)).await.unwrap();
        assert_eq!(raid::find("wait").unwrap().state(), State::Configuring);
        mallocs(&["later0", "later1"], 512);
        wait_examine().await;
        assert_eq!(raid::find("wait").unwrap().state(), State::Online);
    });
}

#[test]
fn raid1_degrades_and_rebuilds_an_added_member() {
    run(|| async {
        ferrite_raid::register_module();
        mallocs(&["d0", "d1", "d2"], 4096);
        raid::create(opts("dd", Level::Raid1, &["d0", "d1"], 0, true)).await.unwrap();
        let (_d, ch) = channel("dd");
        let data = pattern(3, 256 * 512);
        write(&ch, 0, &data).await;
        raid::remove_base_bdev("d0").await.unwrap();
        let r = raid::find("dd").unwrap();
        assert_eq!(r.state(), State::Online);
        assert_eq!(r.info()["num_base_bdevs_operational"], 1);
        let more = pattern(4, 64 * 512);
        write(&ch, 1000, &more).await;
        assert_eq!(read(&ch, 0, data.len()).await, data, "degraded reads");
        let o = ferrite_raid::process::Opts { window_kb: 16, max_bandwidth_mb_sec: 0 };
        raid::add_base_bdev("dd", "d2", o).await.unwrap();
        // Writes during the rebuild reach the target too.
        let during = pattern(5, 32 * 512);
        write(&ch, 2000, &during).await;
        for _ in 0..200 {
            if r.info().get("process").is_none() {
                break;
            }
            ferrite_reactor::sleep(Duration::from_millis(10)).await;
        }
        assert!(r.info().get("process").is_none(), "the rebuild finished: {}", r.info());
        assert_eq!(r.info()["num_base_bdevs_discovered"], 2);
        let off = r.info()["base_bdevs_list"][0]["data_offset"].as_u64().unwrap();
        assert_eq!(off, 2048, "1 MiB of 512-byte blocks for the superblock");
        assert_eq!(read_member("d2", off, data.len()).await, data, "rebuilt");
        assert_eq!(read_member("d2", off + 1000, more.len()).await, more);
        assert_eq!(read_member("d2", off + 2000, during.len()).await, during);
        raid::remove_base_bdev("d1").await.unwrap();
        assert_eq!(read(&ch, 0, data.len()).await, data, "served by the rebuilt member alone");
    });
}

#[test]
fn a_raid_with_a_superblock_assembles_by_examine_and_a_stale_member_is_left_out() {
    run(|| async {
        ferrite_raid::register_module();
        mallocs(&["s0", "s1"], 4096);
        raid::create(opts("ss", Level::Raid1, &["s0", "s1"], 0, true)).await.unwrap();
        let data = pattern(6, 128 * 512);
        {
            let (_d, ch) = channel("ss");
            write(&ch, 100, &data).await;
        }
        // s0 leaves: s1's superblock (one sequence number up) says s0 is missing.
        raid::remove_base_bdev("s0").await.unwrap();
        let seq = |b: &str| {
            let b = b.to_string();
            async move {
                let raw = read_member(&b, 0, 512).await;
                ferrite_raid::sb::Superblock::decode(&raw).unwrap()
            }
        };
        let (old, new) = (seq("s0").await, seq("s1").await);
        assert!(new.seq_number > old.seq_number, "{} > {}", new.seq_number, old.seq_number);
        raid::delete("ss", false).await.unwrap();
        assert!(raid::find("ss").is_none());
        // Examine the stale member first: the RAID made from its copy is made again from
        // s1's newer one, without s0.
        for b in ["s0", "s1"] {
            ferrite_bdev::module::offer(&ferrite_bdev::lookup(b).unwrap());
            wait_examine().await;
        }
        let r = raid::find("ss").expect("assembled");
        assert_eq!(r.state(), State::Online, "{}", r.info());
        assert_eq!(r.info()["num_base_bdevs_discovered"], 1, "{}", r.info());
        assert!(ferrite_bdev::lookup("s0").unwrap().claimed_by().is_none(), "the stale member is not taken");
        let (_d, ch) = channel("ss");
        assert_eq!(read(&ch, 100, data.len()).await, data);
    });
}

#[test]
fn a_returning_member_of_an_online_raid1_is_rebuilt_before_it_is_trusted() {
    run(|| async {
        ferrite_raid::register_module();
        mallocs(&["t0", "t1"], 4096);
        raid::create(opts("tt", Level::Raid1, &["t0", "t1"], 0, true)).await.unwrap();
        let (_d, ch) = channel("tt");
        raid::remove_base_bdev("t0").await.unwrap();
        // Written while t0 was away: t0 does not have it.
        let data = pattern(7, 64 * 512);
        write(&ch, 300, &data).await;
        ferrite_bdev::module::offer(&ferrite_bdev::lookup("t0").unwrap());
        wait_examine().await;
        let r = raid::find("tt").unwrap();
        for _ in 0..200 {
            if r.info().get("process").is_none() && r.info()["num_base_bdevs_discovered"] == 2 {
                break;
            }
            ferrite_reactor::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(r.info()["num_base_bdevs_discovered"], 2, "re-added: {}", r.info());
        assert!(r.info().get("process").is_none(), "and rebuilt: {}", r.info());
        assert_eq!(read_member("t0", 2048 + 300, data.len()).await, data, "the rebuild brought it up to date");
    });
}

#[test]
fn raid5f_places_data_and_rotating_parity_as_spdk_does() {
    run(|| async {
        ferrite_raid::register_module();
        let names = ["f0", "f1", "f2", "f3"];
        mallocs(&names, 2048);
        raid::create(opts("r5", Level::Raid5f, &names, 4, false)).await.unwrap();
        let r = ferrite_bdev::lookup("r5").unwrap();
        let (strip, stripe) = (8u64, 24u64);
        assert_eq!(r.num_blocks(), 2048 / strip * stripe, "three data strips per stripe");
        let l = r.limits();
        assert_eq!((l.write_unit_size, l.split_on_write_unit), (stripe as u32, true), "SPDK's write unit: a stripe");
        assert_eq!((l.optimal_io_boundary, l.split_on_optimal_io_boundary), (strip as u32, true));
        assert!(!r.supports(IoType::Unmap) && !r.supports(IoType::Flush), "no null-payload I/O, as SPDK's");
        let (_d, ch) = channel("r5");
        // Ten stripes from stripe 1 (the layer splits them), read back whole and unaligned.
        let data = pattern(11, (10 * stripe * BS) as usize);
        write(&ch, stripe, &data).await;
        assert_eq!(read(&ch, stripe, data.len()).await, data);
        assert_eq!(read(&ch, stripe + 5, 37 * 512).await, data[5 * 512..42 * 512]);
        // Each strip where SPDK puts it; the parity strip (on slot 3 - s % 4) is their XOR.
        for s in 1..11u64 {
            let p = ferrite_raid::level::raid5f_parity_slot(s, 4);
            assert_eq!(p, 3 - (s % 4) as usize);
            let mut xor = vec![0u8; (strip * BS) as usize];
            for k in 0..3 {
                let slot = ferrite_raid::level::raid5f_data_slot(s, k, 4);
                let on = read_member(names[slot], s * strip, (strip * BS) as usize).await;
                let at = (((s - 1) * stripe + k as u64 * strip) * BS) as usize;
                assert_eq!(on, data[at..at + (strip * BS) as usize], "stripe {s} data strip {k} on slot {slot}");
                xor.iter_mut().zip(&on).for_each(|(x, b)| *x ^= b);
            }
            assert_eq!(read_member(names[p], s * strip, (strip * BS) as usize).await, xor, "stripe {s} parity");
        }
        // Writes that are not whole stripes fail, as SPDK's; nothing changed.
        for (off, num) in [(stripe, 12u64), (12, stripe), (stripe, stripe + 8)] {
            let c = ch.submit_wait(IoRequest::write(off, num, IoBuf::heap((num * BS) as usize))).await;
            assert!(!c.status.is_ok(), "a write of {num} blocks at {off}: {:?}", c.status);
        }
        assert_eq!(read(&ch, stripe, data.len()).await, data);
    });
}

#[test]
fn a_degraded_raid5f_reconstructs_reads_takes_writes_and_rebuilds_a_member() {
    run(|| async {
        ferrite_raid::register_module();
        let names = ["g0", "g1", "g2"];
        mallocs(&names, 4096);
        raid::create(opts("g5", Level::Raid5f, &names, 8, true)).await.unwrap();
        let stripe = 32u64;
        let (d, ch) = channel("g5");
        let data = pattern(12, (8 * stripe * BS) as usize);
        write(&ch, 0, &data).await;
        // g1 leaves: its strips (data or parity) come from the other two.
        raid::remove_base_bdev("g1").await.unwrap();
        let r = raid::find("g5").unwrap();
        assert_eq!(r.state(), State::Online, "{}", r.info());
        assert_eq!(r.info()["num_base_bdevs_operational"], 2);
        assert_eq!(read(&ch, 0, data.len()).await, data, "reconstructed");
        assert_eq!(read(&ch, 3, 9 * 512).await, data[3 * 512..12 * 512], "a part of a strip");
        // Degraded writes: the missing member's strip is left out, and reads rebuild it.
        let more = pattern(13, (4 * stripe * BS) as usize);
        write(&ch, 16 * stripe, &more).await;
        assert_eq!(read(&ch, 16 * stripe, more.len()).await, more);
        assert_eq!(read(&ch, 0, data.len()).await, data);
        // g1 comes back: rebuilt from the others (its stale strips overwritten), while writes
        // go on; then g0 leaves and everything reads back from g1 and g2.
        let o = ferrite_raid::process::Opts { window_kb: 32, max_bandwidth_mb_sec: 0 };
        raid::add_base_bdev("g5", "g1", o).await.unwrap();
        let during = pattern(15, (2 * stripe * BS) as usize);
        write(&ch, 40 * stripe, &during).await;
        for _ in 0..500 {
            if r.info().get("process").is_none() {
                break;
            }
            ferrite_reactor::sleep(Duration::from_millis(10)).await;
        }
        assert!(r.info().get("process").is_none(), "the rebuild finished: {}", r.info());
        assert_eq!(r.info()["num_base_bdevs_discovered"], 3, "{}", r.info());
        raid::remove_base_bdev("g0").await.unwrap();
        assert_eq!(read(&ch, 0, data.len()).await, data, "from the rebuilt member and parity");
        assert_eq!(read(&ch, 16 * stripe, more.len()).await, more);
        assert_eq!(read(&ch, 40 * stripe, during.len()).await, during);
        // Losing a second member takes it offline (once its opener has closed it).
        drop((ch, d));
        raid::remove_base_bdev("g2").await.unwrap();
        assert_eq!(r.state(), State::Offline);
    });
}

#[test]
fn a_raid5f_in_spdks_layout_assembles_by_examine_and_reads_back_degraded() {
    // The members written as SPDK's raid5f.c lays a RAID out, by its own formulas (not
    // Ferrite's): stripe s is block s × strip of every member's data region, its parity on
    // member `data_chunks - s % n`, data strip k on member k, or k + 1 from the parity's on.
    // (The SPDK build the tests use has no raid5f, CONFIG_RAID5F, to write one itself.)
    run(|| async {
        ferrite_raid::register_module();
        let names = ["h0", "h1", "h2", "h3"];
        mallocs(&names, 4096);
        let (n, strip, data_offset) = (4u64, 16u64, 2048u64);
        let stripes = (4096 - data_offset) / strip;
        let uuid = uuid::Uuid::parse_str("7d2b1f7e-8a0c-4b8e-9d3f-2a4e5c6b7a85").unwrap();
        let sb = ferrite_raid::sb::Superblock {
            minor: 0,
            flags: 0,
            uuid,
            name: "h5".into(),
            raid_size: stripes * strip * (n - 1),
            block_size: BS as u32,
            level: 95,
            strip_size: strip as u32,
            state: 0,
            seq_number: 1,
            num_base_bdevs: n as u8,
            members: names
                .iter()
                .enumerate()
                .map(|(i, b)| ferrite_raid::sb::Member {
                    uuid: ferrite_bdev::lookup(b).unwrap().uuid(),
                    data_offset,
                    data_size: stripes * strip,
                    state: ferrite_raid::sb::MemberState::Configured,
                    flags: 0,
                    slot: i as u8,
                })
                .collect(),
        };
        let sbytes = sb.encode(4096);
        let data = pattern(14, (20 * strip * (n - 1) * BS) as usize);
        let sl = (strip * BS) as usize;
        for (i, b) in names.iter().enumerate() {
            let (d, ch) = channel(b);
            write(&ch, 0, &sbytes).await;
            let mut member = vec![0u8; 20 * sl];
            for s in 0..20usize {
                let p = (n - 1 - s as u64 % n) as usize;
                let strip_of = |k: usize| &data[(s * 3 + k) * sl..(s * 3 + k + 1) * sl];
                let out = &mut member[s * sl..(s + 1) * sl];
                if i == p {
                    for k in 0..3 {
                        out.iter_mut().zip(strip_of(k)).for_each(|(o, x)| *o ^= x);
                    }
                } else {
                    out.copy_from_slice(strip_of(if i < p { i } else { i - 1 }));
                }
            }
            write(&ch, data_offset, &member).await;
            drop((ch, d));
        }
        for b in names {
            ferrite_bdev::module::offer(&ferrite_bdev::lookup(b).unwrap());
            wait_examine().await;
        }
        let r = raid::find("h5").expect("assembled by examine");
        assert_eq!(r.state(), State::Online, "{}", r.info());
        assert_eq!((r.level, r.uuid), (Level::Raid5f, uuid));
        {
            let (_d, ch) = channel("h5");
            assert_eq!(read(&ch, 0, data.len()).await, data);
        }
        // Each member missing in turn would do; h2 holds data and parity strips.
        raid::remove_base_bdev("h2").await.unwrap();
        let (_d, ch) = channel("h5");
        assert_eq!(read(&ch, 0, data.len()).await, data, "rebuilt from the parity laid out as SPDK's");
    });
}
