//! The crash disk (the simulated disk of the crash-consistency tests): reads see every write,
//! a flush makes writes durable, and a power cut keeps per block a prefix of its unflushed
//! versions, as the generator decides; then every request fails.

mod common;

use common::{buf_filled, buf_from, io, payload};
use ferrite_bdev::{Bdev, IoRequest, IoStatus};
use ferrite_reactor::Sim;
use ferrite_testkit::crash_disk::{self, CrashDisk};

const BS: usize = 512;
const BLOCKS: usize = 16;

fn block(tag: u8) -> Vec<u8> {
    vec![tag; BS]
}

/// Writes 0xA1 to blocks 0..4 and flushes, then 0xB2 to blocks 0..4 (one request), 0xC3 then
/// 0xD4 to block 5, and zeroes to block 6 (which held 0x77 from the start); checks that reads
/// see all of it. Returns the disk.
fn written(sim: &mut Sim) -> CrashDisk {
    let mut image = vec![0u8; BS * BLOCKS];
    image[6 * BS..7 * BS].fill(0x77);
    let disk = sim.on(0, || crash_disk::create("C", BS as u32, image)).unwrap();
    let rx = sim.engine().run_async(0, || async {
        let desc = Bdev::open_ext("C", true, |_| {}).unwrap();
        let ch = desc.channel().unwrap();
        let w = |lba: u64, n: u64, tag: u8| IoRequest::write(lba, n, buf_from(&vec![tag; BS * n as usize]));
        for req in [
            w(0, 4, 0xa1),
            IoRequest::new(ferrite_bdev::IoType::Flush, 0, BLOCKS as u64),
            w(0, 4, 0xb2),
            w(5, 1, 0xc3),
            w(5, 1, 0xd4),
        ] {
            assert_eq!(io(&ch, req).await.status, IoStatus::Success);
        }
        assert_eq!(io(&ch, IoRequest::new(ferrite_bdev::IoType::WriteZeroes, 6, 1)).await.status, IoStatus::Success);
        let c = io(&ch, IoRequest::read(0, 8, buf_filled(8 * BS, 0xee))).await;
        assert_eq!(c.status, IoStatus::Success);
        payload(&c)
    });
    let read = sim.block_on(rx, 100_000).unwrap();
    let mut want = Vec::new();
    for tag in [0xb2, 0xb2, 0xb2, 0xb2, 0, 0xd4, 0, 0] {
        want.extend(block(tag));
    }
    assert_eq!(read, want, "reads see the newest version of every block");
    assert_eq!(disk.current_image()[..8 * BS], want[..]);
    assert_eq!(disk.unflushed_blocks(), 6, "blocks 0-3, 5 and 6 are unflushed");
    disk
}

fn blocks_of(image: &[u8]) -> Vec<u8> {
    image
        .chunks(BS)
        .map(|b| {
            assert!(b.iter().all(|x| *x == b[0]), "a block holds one version whole");
            b[0]
        })
        .collect()
}

#[test]
fn a_crash_that_keeps_nothing_unflushed_leaves_the_flushed_image() {
    let mut sim = Sim::new(1, 1).unwrap();
    let disk = written(&mut sim);
    disk.crash(|_| 0);
    assert_eq!(&blocks_of(&disk.image())[..8], &[0xa1, 0xa1, 0xa1, 0xa1, 0, 0, 0x77, 0]);
}

#[test]
fn a_crash_that_keeps_everything_leaves_the_newest_image() {
    let mut sim = Sim::new(2, 1).unwrap();
    let disk = written(&mut sim);
    disk.crash(|n| n);
    assert_eq!(&blocks_of(&disk.image())[..8], &[0xb2, 0xb2, 0xb2, 0xb2, 0, 0xd4, 0, 0]);
}

#[test]
fn a_crash_tears_multi_block_writes_and_keeps_prefixes_of_each_blocks_history() {
    let mut sim = Sim::new(3, 1).unwrap();
    let disk = written(&mut sim);
    // Blocks in order 0, 1, 2, 3, 5, 6: keep, drop, keep, drop, the first of two, drop.
    let mut choices = [1usize, 0, 1, 0, 1, 0].into_iter();
    disk.crash(|_| choices.next().unwrap());
    assert_eq!(&blocks_of(&disk.image())[..8], &[0xb2, 0xa1, 0xb2, 0xa1, 0, 0xc3, 0x77, 0]);
}

#[test]
fn after_a_crash_every_request_fails_and_a_flush_makes_writes_survive_the_next() {
    let mut sim = Sim::new(4, 1).unwrap();
    let disk = written(&mut sim);
    let rx = sim.engine().run_async(0, || async {
        let desc = Bdev::open_ext("C", true, |_| {}).unwrap();
        let ch = desc.channel().unwrap();
        io(&ch, IoRequest::new(ferrite_bdev::IoType::Flush, 0, BLOCKS as u64)).await.status
    });
    assert_eq!(sim.block_on(rx, 100_000).unwrap(), IoStatus::Success);
    assert_eq!(disk.unflushed_blocks(), 0);
    disk.crash(|_| 0);
    assert_eq!(&blocks_of(&disk.image())[..8], &[0xb2, 0xb2, 0xb2, 0xb2, 0, 0xd4, 0, 0], "flushed writes survive");
    let rx = sim.engine().run_async(0, || async {
        let desc = Bdev::open_ext("C", true, |_| {}).unwrap();
        let ch = desc.channel().unwrap();
        let r = io(&ch, IoRequest::read(0, 1, buf_filled(BS, 0))).await.status;
        let w = io(&ch, IoRequest::write(0, 1, buf_from(&block(9)))).await.status;
        (r, w)
    });
    let (r, w) = sim.block_on(rx, 100_000).unwrap();
    assert!(matches!(r, IoStatus::Failed(_)) && matches!(w, IoStatus::Failed(_)), "{r:?} {w:?}");
    assert_eq!(disk.counts().failed, 2);
    assert_eq!(blocks_of(&disk.image())[0], 0xb2, "a write after the cut changes nothing");
}

#[test]
fn crash_at_cuts_the_power_on_the_chosen_write_and_tears_it() {
    let mut sim = Sim::new(5, 1).unwrap();
    let disk = sim.on(0, || crash_disk::create("K", BS as u32, vec![0; BS * BLOCKS])).unwrap();
    // The third write or flush cuts the power; every unflushed version survives.
    disk.crash_at(3, |n| n);
    let rx = sim.engine().run_async(0, || async {
        let desc = Bdev::open_ext("K", true, |_| {}).unwrap();
        let ch = desc.channel().unwrap();
        let mut out = Vec::new();
        for (lba, n, tag) in [(0u64, 1u64, 1u8), (1, 1, 2), (2, 2, 3), (4, 1, 4)] {
            out.push(io(&ch, IoRequest::write(lba, n, buf_from(&vec![tag; BS * n as usize]))).await.status);
        }
        out
    });
    let st = sim.block_on(rx, 100_000).unwrap();
    assert_eq!(&st[..2], &[IoStatus::Success, IoStatus::Success]);
    assert!(matches!(st[2], IoStatus::Failed(_)) && matches!(st[3], IoStatus::Failed(_)), "{st:?}");
    assert!(disk.crashed());
    // The torn write's blocks are versions like the others: kept here by the chooser.
    assert_eq!(&blocks_of(&disk.image())[..5], &[1, 2, 3, 3, 0]);
}
