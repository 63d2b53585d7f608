//! Fuzzes the vhost-user-blk target's packed-ring path short of the bdev: a packed ring in
//! guest memory taken as a queue's reactor takes it (`packed::PackedRing::pop`, then
//! `request::walk_packed` over its slots and indirect tables), each chain laid out as a
//! virtio-blk request (`request::layout`), the chains completed in a fuzzed order
//! (`push_used`), each one kept in a packed inflight area as vring keeps it; halfway and at the
//! end a restarted daemon's view of that area must agree with the ring's positions.
//!
//! The input: 8 control bytes, then the guest's memory from guest-physical 0.
//!
//! - byte 0: the ring size, 1 + byte % 64 (packed sizes need not be powers of two);
//! - byte 1: bit 0 EVENT_IDX; bit 1 a small bound on a chain's descriptors (byte >> 2, else
//!   vring's 134); bits 4 to 7 a small seg_max (else the device's 126);
//! - bytes 2-3: the ring's position (SET_VRING_BASE: slot, wrap counter in bit 15);
//! - byte 4: the order completions go in (bit 0 reversed, bits 1-3 a rotation);
//! - byte 5: how many chains are taken (1 + byte % 16).
//!
//! Guest memory is two regions mapped from a memfd, 8 KiB at 0 (the input's image: the
//! descriptor ring at 0, the driver and device areas right after it; descriptors may point
//! anywhere) and 4 KiB at 64 KiB, with a hole between. Nothing may panic; every walk ends;
//! what lays out keeps the layout's promises; the used position catches up with the available
//! one once everything is used, whatever the order; the inflight area says the same.

#![no_main]

use ferrite_vhost::blk::{Header, HEADER_LEN, T_GET_ID, T_IN};
use ferrite_vhost::inflight::InflightArea;
use ferrite_vhost::memory::Memory;
use ferrite_vhost::packed::{PackedRing, Pos, DESC_F_AVAIL, DESC_F_USED};
use ferrite_vhost::request::{layout, walk_packed, Desc, Walked};
use libfuzzer_sys::fuzz_target;
use std::fs::File;
use std::os::fd::FromRawFd;
use std::sync::Arc;
use vhost::vhost_user::message::VhostUserMemoryRegion;
use vm_memory::{Bytes, GuestAddress};

const LOW: u64 = 8 << 10;
const HIGH_AT: u64 = 64 << 10;
const HIGH: u64 = 4 << 10;

thread_local! {
    static MEM: Arc<Memory> = {
        // SAFETY: a fresh memfd, owned by the File.
        let fd = unsafe { libc::memfd_create(c"fuzz-packed".as_ptr(), libc::MFD_CLOEXEC) };
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

/// Checks what `layout` promises of a request laid out from `descs`.
fn check_layout(descs: &[Desc], l: &ferrite_vhost::request::Layout, seg_max: usize) {
    assert!(l.data.len() <= seg_max);
    assert_eq!(l.data_len, l.data.iter().map(|&(_, n)| n as u64).sum::<u64>());
    let last = descs.iter().rposition(|d| d.len > 0).expect("a status descriptor");
    assert!(descs[last].write);
    assert_eq!(l.status, descs[last].addr + (descs[last].len as u64 - 1));
    let writes = l.header.kind == T_IN || l.header.kind == T_GET_ID;
    let inside =
        |a: u64, n: u64, d: &Desc| a >= d.addr && (a - d.addr).checked_add(n).is_some_and(|e| e <= d.len as u64);
    for &(a, n) in &l.data {
        assert!(n > 0);
        assert!(descs.iter().any(|d| d.write == writes && inside(a, n as u64, d)), "segment {a:#x}+{n}");
    }
}

fn run(data: &[u8]) {
    let mut c = [0u8; 8];
    let n = data.len().min(8);
    c[..n].copy_from_slice(&data[..n]);
    let image = &data[n..];
    let mut raw = [0u8; HEADER_LEN];
    let k = image.len().min(HEADER_LEN);
    raw[..k].copy_from_slice(&image[..k]);
    let _ = Header::decode(&raw);

    MEM.with(|mem| {
        let g = &mem.guest;
        let low = image.len().min(LOW as usize);
        g.write_slice(&image[..low], GuestAddress(0)).unwrap();
        g.write_slice(&vec![0u8; LOW as usize - low], GuestAddress(low as u64)).unwrap();
        let high = (image.len() - low).min(HIGH as usize);
        g.write_slice(&image[low..low + high], GuestAddress(HIGH_AT)).unwrap();
        g.write_slice(&vec![0u8; HIGH as usize - high], GuestAddress(HIGH_AT + high as u64)).unwrap();

        let size = 1 + (c[0] % 64) as u16;
        let desc = 0u64;
        let driver = 16 * size as u64;
        let device = driver + 4;
        let event_idx = c[1] & 1 != 0;
        let max = if c[1] & 2 != 0 { (c[1] >> 2) as usize } else { 134 };
        let seg_max = if c[1] >> 4 != 0 { (c[1] >> 4) as usize } else { 126 };
        let base = u16::from_le_bytes([c[2], c[3]]);
        let start = Pos { index: (base & 0x7fff) % size, wrap: base & 0x8000 != 0 };
        let mut q = PackedRing::new(mem.clone(), size, desc, driver, device, start, start, event_idx)
            .expect("rings of up to 64 slots fit in the first region, aligned");
        let (area, _file) = InflightArea::create_packed(1, size).expect("an area");
        let mut f = area.queue(0, size).expect("its queue");
        assert!(f.recover_packed(start, |_| None).entries.is_empty(), "a fresh area has nothing in flight");
        q.enable_kicks();
        let mut held = Vec::new();
        let mut descs = Vec::new();
        let read = |a: u64| {
            let mut b = [0u8; 16];
            mem.read(a, &mut b).then_some(b)
        };
        for _ in 0..1 + c[5] % 16 {
            let before = (q.next_avail(), q.in_flight());
            let a = match q.pop() {
                Ok(Some(a)) => a,
                Ok(None) => break,
                // A chain over the whole ring or more than the ring in flight: vring breaks
                // the queue; nothing moved.
                Err(_) => {
                    assert_eq!((q.next_avail(), q.in_flight()), before);
                    break;
                }
            };
            assert!(a.count >= 1 && a.count <= size && a.slot == before.0.index);
            assert!(q.in_flight() <= size);
            let slot = |i: u16| q.desc_at(((a.slot as u32 + i as u32) % size as u32) as u16);
            let entry = f.begin_packed(a.count, slot).expect("the free list holds what the ring holds");
            let walked = walk_packed(slot, a.count, read, max, &mut descs);
            assert!(descs.len() <= max.max(1));
            let mut len = 0;
            if let Ok(w) = walked {
                let bound = if w == Walked::Overlong { 0 } else { seg_max };
                if let Ok(l) = layout(&descs, bound, |a, b| mem.read(a, b)) {
                    check_layout(&descs, &l, bound);
                    len = if mem.covers(l.status, 1) { 1 } else { 0 };
                }
            }
            held.push((a, entry, len));
        }
        let _ = q.needs_signal();
        // Completions in a fuzzed order.
        if c[4] & 1 != 0 {
            held.reverse();
        }
        if !held.is_empty() {
            let r = ((c[4] >> 1) & 7) as usize % held.len();
            held.rotate_left(r);
        }
        let half = held.len() / 2;
        for (i, &(a, entry, len)) in held.iter().enumerate() {
            if i == half {
                // A restart now: the area says where the ring is and what is in flight.
                let (u, pending) = (q.next_used(), q.in_flight());
                let flags = |s: u16| {
                    let mut b = [0u8; 2];
                    mem.read(desc + 16 * s as u64 + 14, &mut b).then(|| u16::from_le_bytes(b))
                };
                let r = f.recover_packed(start, flags);
                assert_eq!((r.used, r.in_flight), (u, pending), "the inflight area agrees with the ring");
                assert_eq!(r.entries.len(), held.len() - half);
            }
            f.completing_packed(entry, a.count);
            let at = q.next_used();
            let (gpa, n) = q.push_used(a.id, len, a.count);
            assert_eq!((gpa, n), (desc + 16 * at.index as u64, 16), "the used descriptor at the used position");
            let mut d = [0u8; 16];
            assert!(mem.read(gpa, &mut d));
            let flags = u16::from_le_bytes([d[14], d[15]]);
            assert_eq!(flags & DESC_F_USED != 0, at.wrap);
            assert_eq!(flags & DESC_F_AVAIL != 0, at.wrap);
            assert_eq!(u16::from_le_bytes([d[12], d[13]]), a.id);
            assert_eq!(q.next_used(), at.advance(a.count, size));
            f.completed_packed(entry);
        }
        assert_eq!(q.in_flight(), 0);
        assert_eq!(q.next_used(), q.next_avail(), "every chain used: the positions meet");
        let r = f.recover_packed(start, |_| None);
        assert_eq!((r.used, r.in_flight, r.entries.len()), (q.next_used(), 0, 0));
        let _ = q.needs_signal();
        q.disable_kicks();
        let _ = q.enable_kicks();
    });
}

fuzz_target!(|data: &[u8]| run(data));
