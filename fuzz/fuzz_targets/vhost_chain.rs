//! Fuzzes the vhost-user-blk target's request path short of the bdev: a split ring in guest
//! memory walked as a queue's reactor walks it (`split::SplitRing` for the heads, then
//! `request::walk_chain`), each chain laid out as a virtio-blk request (`request::layout`), its
//! data segments turned into host pieces (`Memory::host_pieces`), the request header and a
//! discard segment decoded, and the configuration space read at a fuzzed offset and length.
//!
//! The input: 8 control bytes, then the guest's memory from guest-physical 0.
//!
//! - byte 0: the ring size, 1 << (byte % 7) (1 to 64 entries);
//! - byte 1: bit 0 EVENT_IDX; bit 1 a small bound on a chain's descriptors (byte >> 2, else
//!   vring's 1024); bits 4 to 7 a small seg_max (else the device's 126 + 2);
//! - bytes 2-3: where the queue starts in the available ring (SET_VRING_BASE);
//! - bytes 4-5, 6-7: offset and length of a configuration read (the offset's high bits set
//!   from byte 1 bit 2, to reach the overflow checks).
//!
//! Guest memory is two regions mapped from a memfd, 8 KiB at 0 (the input's image: descriptor
//! table at 0, then the available and used rings; descriptors may point anywhere) and 4 KiB at
//! 64 KiB, with a hole between. Nothing may panic; every chain's walk ends (the ring's size
//! bounds it); what lays out keeps the layout's promises (segments bounded, lengths summed, data
//! inside the chain's buffers, the status byte in the last device-writable one).

#![no_main]

use ferrite_vhost::blk::{Config, Header, Segment, HEADER_LEN, SEGMENT_LEN, T_DISCARD, T_IN};
use ferrite_vhost::memory::Memory;
use ferrite_vhost::request::{layout, walk_chain, Desc, Walked};
use libfuzzer_sys::fuzz_target;
use std::fs::File;
use std::os::fd::FromRawFd;
use vhost::vhost_user::message::VhostUserMemoryRegion;
use ferrite_vhost::split::SplitRing;
use std::sync::Arc;
use vm_memory::{Bytes, GuestAddress};

/// The first region: the input's image.
const LOW: u64 = 8 << 10;
/// The second region, past a hole.
const HIGH_AT: u64 = 64 << 10;
const HIGH: u64 = 4 << 10;
/// Chains taken per input (vring's batch is 64; a few show the ring moving on).
const BATCH: usize = 8;

thread_local! {
    static MEM: Arc<Memory> = {
        // SAFETY: a fresh memfd, owned by the File.
        let fd = unsafe { libc::memfd_create(c"fuzz-vhost".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(LOW + HIGH).unwrap();
        let regions = [
            VhostUserMemoryRegion::new(0, LOW, 0x7000_0000, 0),
            VhostUserMemoryRegion::new(HIGH_AT, HIGH, 0x9000_0000, LOW),
        ];
        Arc::new(Memory::map(&regions, vec![file.try_clone().unwrap(), file]).expect("guest memory"))
    };
}

fn u16_at(b: &[u8], i: usize) -> u16 {
    u16::from_le_bytes([b[i], b[i + 1]])
}

/// Checks what `layout` promises of a request laid out from `descs`.
fn check_layout(descs: &[Desc], l: &ferrite_vhost::request::Layout, seg_max: usize) {
    assert!(l.data.len() <= seg_max);
    assert_eq!(l.data_len, l.data.iter().map(|&(_, n)| n as u64).sum::<u64>());
    let inside =
        |a: u64, n: u64, d: &Desc| a >= d.addr && (a - d.addr).checked_add(n).is_some_and(|e| e <= d.len as u64);
    assert!(l.data.iter().all(|&(_, n)| n > 0));
    let last = descs.iter().rposition(|d| d.len > 0).expect("a status descriptor");
    assert!(descs[last].write);
    assert_eq!(l.status, descs[last].addr + (descs[last].len as u64 - 1));
    // Reads take the device-writable buffers, the rest the device-readable ones.
    let writes = l.header.kind == T_IN || l.header.kind == ferrite_vhost::blk::T_GET_ID;
    for &(a, n) in &l.data {
        assert!(
            descs.iter().any(|d| d.write == writes && inside(a, n as u64, d)),
            "segment {a:#x}+{n} on the wrong side"
        );
    }
}

fn run(data: &[u8]) {
    let mut c = [0u8; 8];
    let n = data.len().min(8);
    c[..n].copy_from_slice(&data[..n]);
    let image = &data[n..];

    // The configuration space at any offset and length.
    let mut off = u16_at(&c, 4) as u32;
    if c[1] & 4 != 0 {
        off |= 0xffff_0000;
    }
    let len = u16_at(&c, 6) as u32;
    let config =
        Config { capacity: u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]), ..Default::default() };
    match config.read(off, len) {
        Some(b) => {
            assert_eq!(b.len(), len as usize);
            assert!(off as usize + len as usize <= ferrite_vhost::blk::MAX_CONFIG_LEN);
        }
        None => assert!(off.checked_add(len).is_none_or(|e| e as usize > ferrite_vhost::blk::MAX_CONFIG_LEN)),
    }
    // The header and segment decoders on the image's first bytes.
    let mut raw = [0u8; HEADER_LEN];
    let k = image.len().min(HEADER_LEN);
    raw[..k].copy_from_slice(&image[..k]);
    let h = Header::decode(&raw);
    assert_eq!(h.sector.to_le_bytes(), raw[8..16]);
    let s = Segment::decode(&raw);
    assert_eq!(s.num_sectors.to_le_bytes(), raw[8..12]);

    MEM.with(|mem| {
        let g = &mem.guest;
        // The image, the rest of guest memory zeroed.
        let low = image.len().min(LOW as usize);
        g.write_slice(&image[..low], GuestAddress(0)).unwrap();
        g.write_slice(&vec![0u8; LOW as usize - low], GuestAddress(low as u64)).unwrap();
        let high = (image.len() - low).min(HIGH as usize);
        g.write_slice(&image[low..low + high], GuestAddress(HIGH_AT)).unwrap();
        g.write_slice(&vec![0u8; HIGH as usize - high], GuestAddress(HIGH_AT + high as u64)).unwrap();

        let size = 1u16 << (c[0] % 7);
        let desc = 0u64;
        let avail = 16 * size as u64;
        let used = (avail + 6 + 2 * size as u64 + 3) & !3;
        let max = if c[1] & 2 != 0 { (c[1] >> 2) as usize } else { 1024 };
        let seg_max = if c[1] >> 4 != 0 { (c[1] >> 4) as usize } else { 128 };
        let used_idx = u16::from_le_bytes([image.get(used as usize + 2).copied().unwrap_or(0), image.get(used as usize + 3).copied().unwrap_or(0)]);
        let mut q = SplitRing::new(mem.clone(), size, avail, used, u16_at(&c, 2), used_idx, c[1] & 1 != 0)
            .expect("rings of up to 64 entries fit in the first region, aligned");
        q.enable_kicks();
        let mut descs = Vec::new();
        for _ in 0..BATCH {
            let head = match q.pop() {
                Ok(Some(h)) => h,
                Ok(None) => break,
                // The available index ran ahead of the ring: vring breaks the queue.
                Err(_) => break,
            };
            let read = |a: u64| {
                let mut b = [0u8; 16];
                mem.read(a, &mut b).then_some(b)
            };
            let walked = walk_chain(read, desc, size, head, max, &mut descs);
            assert!(descs.len() <= max.max(1));
            let Ok(w) = walked else {
                // A chain the walker refuses goes back unanswered.
                q.push_used(head, 0);
                continue;
            };
            // As vring: an overlong chain lays out as too many segments.
            let bound = if w == Walked::Overlong { 0 } else { seg_max };
            let parsed = layout(&descs, bound, |a, b| mem.read(a, b));
            match parsed {
                Ok(l) => {
                    check_layout(&descs, &l, bound);
                    // As `submit`: the data as host pieces, which add up when all there.
                    for &(a, n) in &l.data {
                        let mut total = 0usize;
                        if mem.host_pieces(a, n as u64, |_, k| total += k) {
                            assert_eq!(total, n as usize);
                            assert!(mem.covers(a, n as u64));
                        }
                    }
                    if l.header.kind == T_DISCARD && l.data_len == SEGMENT_LEN as u64 {
                        let mut seg = [0u8; SEGMENT_LEN];
                        let mut at = 0usize;
                        let whole = l.data.iter().all(|&(a, n)| {
                            let ok = g.read_slice(&mut seg[at..at + n as usize], GuestAddress(a)).is_ok();
                            at += n as usize;
                            ok
                        });
                        if whole {
                            let _ = Segment::decode(&seg);
                        }
                    }
                    let status_there = mem.covers(l.status, 1);
                    q.push_used(head, if status_there { 1 } else { 0 });
                }
                Err(_) => {
                    q.push_used(head, 0);
                }
            }
        }
        let _ = q.needs_signal();
        q.disable_kicks();
        let _ = q.enable_kicks();
    });
}

fuzz_target!(|data: &[u8]| run(data));
