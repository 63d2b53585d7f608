//! The limits a SCSI or virtio target advertises, as the layer keeps them: write units (split
//! and refusal), copy and unmap sizes, and the per-segment bounce of segments that break the
//! buffer rules (the others reach the module as the caller's own memory).

mod common;

use common::*;
use ferrite_bdev::{
    register, unregister, BackendChannel, Bdev, BdevBackend, BdevError, BdevIo, BdevProps, IoAux, IoBufs, IoRequest,
    IoStatus, IoType, IoTypes, Limits,
};
use ferrite_reactor::{IoBuf, Lender};
use std::cell::RefCell;
use std::ptr::NonNull;
use std::rc::Rc;
use std::sync::{Arc, Mutex};

/// What the module got: type, range, copy source, and each segment's address and length.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    io_type: IoType,
    offset: u64,
    blocks: u64,
    src: Option<u64>,
    segs: Vec<(usize, usize)>,
}

/// A RAM disk that records every request it gets.
struct Recorder {
    mem: Arc<Mutex<Vec<u8>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
    bs: usize,
}

impl BackendChannel for Recorder {
    fn submit(&mut self, mut io: BdevIo) {
        let src = match io.req.aux {
            IoAux::CopyFrom(s) => Some(s),
            _ => None,
        };
        self.seen.lock().unwrap().push(Seen {
            io_type: io.req.io_type,
            offset: io.req.offset_blocks,
            blocks: io.req.num_blocks,
            src,
            segs: io.req.bufs.iter().map(|b| (b.as_ptr() as usize, b.len())).collect(),
        });
        let (off, len) = (io.offset_bytes() as usize, io.len_bytes() as usize);
        let mut mem = self.mem.lock().unwrap();
        match io.req.io_type {
            IoType::Read => {
                let mut pos = off;
                for b in io.req.bufs.iter_mut() {
                    let n = b.len();
                    b.copy_from_slice(&mem[pos..pos + n]);
                    pos += n;
                }
            }
            IoType::Write => {
                let mut pos = off;
                for b in io.req.bufs.iter() {
                    mem[pos..pos + b.len()].copy_from_slice(b);
                    pos += b.len();
                }
            }
            IoType::Unmap => mem[off..off + len].fill(0),
            IoType::Copy => {
                let s = src.unwrap() as usize * self.bs;
                mem.copy_within(s..s + len, off);
            }
            _ => {}
        }
        drop(mem);
        io.complete_deferred(IoStatus::Success);
    }
}

struct Disk {
    mem: Arc<Mutex<Vec<u8>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
    bs: usize,
}

impl BdevBackend for Disk {
    fn create_channel(&self) -> Result<Box<dyn BackendChannel>, BdevError> {
        Ok(Box::new(Recorder { mem: self.mem.clone(), seen: self.seen.clone(), bs: self.bs }))
    }
    fn config_entry(&self, _: &Bdev) -> Option<serde_json::Value> {
        None
    }
}

/// State the test shares with the module's channels.
type Shared<T> = Arc<Mutex<T>>;

const BS: u32 = 512;
const BLOCKS: u64 = 128;

/// Registers a recording disk of `BLOCKS` blocks under `limits`.
fn disk(name: &str, limits: Limits) -> (Shared<Vec<u8>>, Shared<Vec<Seen>>) {
    let mem = Arc::new(Mutex::new(vec![0u8; (BLOCKS * BS as u64) as usize]));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let props = BdevProps {
        name: name.into(),
        aliases: vec![],
        uuid: None,
        block_size: BS,
        num_blocks: BLOCKS,
        product_name: "Recording disk",
        module: "test",
        io_types: IoTypes::of(&[IoType::Read, IoType::Write, IoType::Unmap, IoType::Copy]),
        limits,
    };
    register(props, Arc::new(Disk { mem: mem.clone(), seen: seen.clone(), bs: BS as usize })).unwrap();
    (mem, seen)
}

/// Writable external memory holding `data`, placed `skew` bytes past a 4 KiB boundary.
fn external(data: &[u8], skew: usize) -> IoBuf {
    let mut backing = vec![0u8; data.len() + skew + 4096];
    let base = backing.as_mut_ptr() as usize;
    let start = base.next_multiple_of(4096) - base + skew;
    backing[start..start + data.len()].copy_from_slice(data);
    let backing = Rc::new(RefCell::new(backing));
    let ptr = NonNull::new(unsafe { backing.borrow_mut().as_mut_ptr().add(start) }).unwrap();
    // SAFETY: `ptr` is valid for data.len() bytes while the lender keeps `backing`.
    unsafe { IoBuf::external(ptr, data.len(), Rc::new(Lender::new(backing))) }
}

fn addrs(bufs: &IoBufs) -> Vec<usize> {
    bufs.iter().map(|b| b.as_ptr() as usize).collect()
}

#[test]
fn a_write_unit_splits_whole_units_and_refuses_parts() {
    let name = "limits_write_unit";
    let (mem, seen) = disk(name, Limits { write_unit_size: 4, split_on_write_unit: true, ..Limits::default() });
    let desc = Bdev::open(name, true, || {}).unwrap();
    let ch = desc.channel().unwrap();
    let data = pattern(1, 12 * BS as usize);
    // Not aligned to the unit, or not a whole number of units: refused, nothing reaches the disk.
    for (off, n) in [(2u64, 4u64), (4, 6), (0, 3), (1, 1)] {
        let w = IoRequest::write(off, n, buf_from(&data[..(n * BS as u64) as usize]));
        assert_eq!(run_one(&ch, w).status, IoStatus::Misaligned, "write [{off}, +{n})");
    }
    assert!(seen.lock().unwrap().is_empty(), "a refused write never reaches the module");
    // One unit: as it is. Three units: one child per unit.
    assert!(run_one(&ch, IoRequest::write(8, 4, buf_from(&data[..4 * BS as usize]))).status.is_ok());
    assert!(run_one(&ch, IoRequest::write(16, 12, buf_from(&data))).status.is_ok());
    let got: Vec<(u64, u64)> = seen.lock().unwrap().iter().map(|s| (s.offset, s.blocks)).collect();
    assert_eq!(got, [(8, 4), (16, 4), (20, 4), (24, 4)]);
    assert_bytes_eq(&mem.lock().unwrap()[16 * BS as usize..28 * BS as usize], &data, "split write");
    // Reads are not held to the unit.
    let r = run_one(&ch, IoRequest::read(17, 3, IoBuf::heap(3 * BS as usize)));
    assert!(r.status.is_ok());
    assert_bytes_eq(&payload(&r), &data[BS as usize..4 * BS as usize], "read inside a unit");
    drop((ch, desc, r));
    unregister(name, None).unwrap();
}

#[test]
fn a_write_unit_no_child_could_carry_is_refused_at_registration() {
    let mut l = Limits { write_unit_size: 8, split_on_write_unit: true, max_io_blocks: 4, ..Limits::default() };
    assert!(disk_err("limits_bad_unit", l).contains("write unit"));
    l.max_io_blocks = 0;
    l.max_segments = 2;
    l.max_segment_size = 2 * BS;
    assert!(disk_err("limits_bad_unit2", l).contains("write unit"));
}

fn disk_err(name: &str, limits: Limits) -> String {
    let props = BdevProps {
        name: name.into(),
        aliases: vec![],
        uuid: None,
        block_size: BS,
        num_blocks: BLOCKS,
        product_name: "Recording disk",
        module: "test",
        io_types: IoTypes::of(&[IoType::Read, IoType::Write]),
        limits,
    };
    let d = Disk { mem: Arc::default(), seen: Arc::default(), bs: BS as usize };
    match register(props, Arc::new(d)) {
        Ok(_) => panic!("{name} registered"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn copies_beyond_the_limit_are_split_with_their_sources() {
    let name = "limits_copy";
    let (mem, seen) = disk(name, Limits { max_copy_blocks: 4, ..Limits::default() });
    let desc = Bdev::open(name, true, || {}).unwrap();
    let ch = desc.channel().unwrap();
    let data = pattern(2, 10 * BS as usize);
    assert!(run_one(&ch, IoRequest::write(0, 10, buf_from(&data))).status.is_ok());
    seen.lock().unwrap().clear();
    assert!(run_one(&ch, IoRequest::copy(50, 0, 10)).status.is_ok());
    let got: Vec<(u64, u64, Option<u64>)> = seen.lock().unwrap().iter().map(|s| (s.offset, s.blocks, s.src)).collect();
    assert_eq!(got, [(50, 4, Some(0)), (54, 4, Some(4)), (58, 2, Some(8))]);
    assert_bytes_eq(&mem.lock().unwrap()[50 * BS as usize..60 * BS as usize], &data, "copied");
    seen.lock().unwrap().clear();
    assert!(run_one(&ch, IoRequest::copy(70, 0, 4)).status.is_ok());
    assert_eq!(seen.lock().unwrap().len(), 1, "a copy within the limit goes as it is");
    drop((ch, desc));
    unregister(name, None).unwrap();
}

#[test]
fn an_unmap_holds_as_many_ranges_as_one_command_carries() {
    let name = "limits_unmap_segments";
    let (_, seen) = disk(name, Limits { max_unmap_blocks: 4, max_unmap_segments: 3, ..Limits::default() });
    let desc = Bdev::open(name, true, || {}).unwrap();
    let ch = desc.channel().unwrap();
    assert!(run_one(&ch, IoRequest::no_payload(IoType::Unmap, 10, 30)).status.is_ok());
    let got: Vec<(u64, u64)> = seen.lock().unwrap().iter().map(|s| (s.offset, s.blocks)).collect();
    assert_eq!(got, [(10, 12), (22, 12), (34, 6)], "4 blocks × 3 ranges per request");
    drop((ch, desc));
    unregister(name, None).unwrap();
}

/// Only the segments that break the address rule are bounced: the others reach the module as
/// the caller's memory (no copy), and a read copies back only into the bounced ones.
#[test]
fn only_misaligned_segments_are_bounced() {
    let name = "limits_bounce_per_segment";
    let (mem, seen) = disk(name, Limits { buf_align: 512, ..Limits::default() });
    let desc = Bdev::open(name, true, || {}).unwrap();
    let ch = desc.channel().unwrap();
    let data = pattern(3, 6 * BS as usize);
    let (a, b, c) = (&data[..1024], &data[1024..2048], &data[2048..]);
    let mut w = IoRequest::new(IoType::Write, 4, 6);
    w.bufs = [external(a, 0), external(b, 8), external(c, 0)].into_iter().collect();
    let caller = addrs(&w.bufs);
    assert!(run_one(&ch, w).status.is_ok());
    let got = seen.lock().unwrap().pop().unwrap();
    assert_eq!(got.segs.len(), 3, "one buffer per bounced segment, not one for the request");
    assert_eq!((got.segs[0].0, got.segs[2].0), (caller[0], caller[2]), "aligned segments kept");
    assert_ne!(got.segs[1].0, caller[1], "the misaligned one bounced");
    assert_eq!(got.segs[1].0 % 512, 0);
    assert_bytes_eq(&mem.lock().unwrap()[4 * BS as usize..10 * BS as usize], &data, "written");
    // Read back through a misaligned middle segment.
    let mut r = IoRequest::new(IoType::Read, 4, 6);
    r.bufs = [external(&[0xee; 1024], 0), external(&[0xee; 1024], 3), external(&[0xee; 1024], 0)].into_iter().collect();
    let caller = addrs(&r.bufs);
    let done = run_one(&ch, r);
    assert!(done.status.is_ok());
    let got = seen.lock().unwrap().pop().unwrap();
    assert_eq!((got.segs[0].0, got.segs[2].0), (caller[0], caller[2]), "read straight into the caller's");
    assert_ne!(got.segs[1].0, caller[1]);
    assert_eq!(addrs(&done.req.bufs), caller, "the caller's segments come back");
    assert_bytes_eq(&payload(&done), &data, "read back and compared");
    drop((ch, desc, done));
    unregister(name, None).unwrap();
}

/// A length rule apart from the address rule: segments whose lengths break it are gathered
/// into one buffer until the run's length meets it; those that meet both are kept.
#[test]
fn segments_of_odd_lengths_are_gathered_until_the_length_rule_holds() {
    let name = "limits_bounce_lengths";
    let (mem, seen) = disk(name, Limits { buf_align: 8, seg_len_align: 512, ..Limits::default() });
    let desc = Bdev::open(name, true, || {}).unwrap();
    let ch = desc.channel().unwrap();
    let data = pattern(4, 4 * BS as usize);
    let lens = [512usize, 100, 412, 1024];
    let mut pos = 0;
    let mut w = IoRequest::new(IoType::Write, 0, 4);
    for n in lens {
        w.bufs.push(external(&data[pos..pos + n], 0));
        pos += n;
    }
    let caller = addrs(&w.bufs);
    assert!(run_one(&ch, w).status.is_ok());
    let got = seen.lock().unwrap().pop().unwrap();
    let lens_seen: Vec<usize> = got.segs.iter().map(|s| s.1).collect();
    assert_eq!(lens_seen, [512, 512, 1024], "100 + 412 gathered into one buffer");
    assert_eq!((got.segs[0].0, got.segs[2].0), (caller[0], caller[3]));
    assert_bytes_eq(&mem.lock().unwrap()[..4 * BS as usize], &data, "written");
    // With only an address rule, the same segments go as they are.
    drop((ch, desc));
    unregister(name, None).unwrap();
    let name = "limits_bounce_address_only";
    let (_, seen) = disk(name, Limits { buf_align: 8, ..Limits::default() });
    let desc = Bdev::open(name, true, || {}).unwrap();
    let ch = desc.channel().unwrap();
    let mut w = IoRequest::new(IoType::Write, 0, 4);
    let mut pos = 0;
    for n in lens {
        w.bufs.push(external(&data[pos..pos + n], 0));
        pos += n;
    }
    let caller = addrs(&w.bufs);
    assert!(run_one(&ch, w).status.is_ok());
    let got = seen.lock().unwrap().pop().unwrap();
    assert_eq!(got.segs.iter().map(|s| s.0).collect::<Vec<_>>(), caller, "nothing bounced");
    drop((ch, desc));
    unregister(name, None).unwrap();
}

/// The unmap hints reach `bdev_get_bdevs` under SPDK's names, and a null bdev's survive a saved
/// config.
#[test]
fn unmap_hints_are_reported_as_spdk_names_them() {
    use ferrite_modules::null::{self, NullOpts};
    let b = null::create(NullOpts {
        name: "limits_null_hints".into(),
        num_blocks: 64,
        block_size: 512,
        preferred_unmap_granularity: 8,
        preferred_unmap_alignment: 2,
        ..Default::default()
    })
    .unwrap();
    let v = ferrite_bdev::rpc::bdev_json(&b);
    assert_eq!(
        (v["preferred_unmap_granularity"].as_u64(), v["preferred_unmap_alignment"].as_u64()),
        (Some(8), Some(2))
    );
    let saved = b.backend().config_entry(&b).unwrap();
    assert_eq!(saved["params"]["preferred_unmap_granularity"], 8, "{saved}");
    let (_, _) = disk("limits_plain_hints", Limits::default());
    let plain = ferrite_bdev::lookup("limits_plain_hints").unwrap();
    assert_eq!(ferrite_bdev::rpc::bdev_json(&plain)["preferred_unmap_granularity"], 0, "written for every bdev");
    unregister("limits_plain_hints", None).unwrap();
    unregister("limits_null_hints", None).unwrap();
}

/// A module that fails every request from block `FAIL_FROM` on with an NVMe status, its dword 0
/// the request's first block.
struct Failing;

const FAIL_FROM: u64 = 8;

impl BackendChannel for Failing {
    fn submit(&mut self, mut io: BdevIo) {
        if io.req.offset_blocks >= FAIL_FROM {
            io.result = io.req.offset_blocks;
            io.complete_deferred(IoStatus::Nvme { sct: 2, sc: 0x81, dnr: true, more: true });
        } else {
            io.complete_deferred(IoStatus::Success);
        }
    }
}

impl BdevBackend for Failing {
    fn create_channel(&self) -> Result<Box<dyn BackendChannel>, BdevError> {
        Ok(Box::new(Failing))
    }
    fn config_entry(&self, _: &Bdev) -> Option<serde_json::Value> {
        None
    }
}

/// A split request completes with its first failed child's status and dword 0, whole.
#[test]
fn a_split_parent_gets_its_first_failures_status_and_dword_0() {
    let name = "limits_split_result";
    let props = BdevProps {
        name: name.into(),
        aliases: vec![],
        uuid: None,
        block_size: BS,
        num_blocks: BLOCKS,
        product_name: "Failing disk",
        module: "test",
        io_types: IoTypes::of(&[IoType::Read, IoType::Write]),
        limits: Limits { max_io_blocks: 4, ..Limits::default() },
    };
    register(props, Arc::new(Failing)).unwrap();
    let desc = Bdev::open(name, true, || {}).unwrap();
    let ch = desc.channel().unwrap();
    let c = run_one(&ch, IoRequest::write(0, 16, buf_from(&[1; 16 * BS as usize])));
    assert_eq!(c.status, IoStatus::Nvme { sct: 2, sc: 0x81, dnr: true, more: true });
    assert_eq!(c.result, FAIL_FROM, "the first failed child's dword 0 (children at 8 and 12 failed)");
    drop((ch, desc, c));
    unregister(name, None).unwrap();
}

/// A buffer the module filled through a view (a split's child, a segment a bounce kept) no
/// longer counts as known zeroes: `IoBuf::zero` clears it afterwards.
#[test]
fn a_buffer_filled_through_a_view_is_not_taken_for_zeroes() {
    let name = "limits_views_written";
    let (_, _) = disk(name, Limits { buf_align: 512, max_io_blocks: 2, ..Limits::default() });
    let desc = Bdev::open(name, true, || {}).unwrap();
    let ch = desc.channel().unwrap();
    let data = pattern(5, 4 * BS as usize);
    assert!(run_one(&ch, IoRequest::write(0, 4, buf_from(&data))).status.is_ok());
    // Split (two children of two blocks), with the first segment kept and the second bounced.
    let mut r = IoRequest::new(IoType::Read, 0, 4);
    r.bufs.push(IoBuf::heap(3 * BS as usize)); // fresh: known zeroes
    r.bufs.push(external(&[0; BS as usize], 8));
    let mut done = run_one(&ch, r);
    assert!(done.status.is_ok());
    assert_bytes_eq(&payload(&done), &data, "read back");
    let mut first = done.req.bufs.remove(0);
    first.zero();
    assert!(first.iter().all(|&b| b == 0), "zero() cleared what the read wrote");
    // Split only: nothing bounced.
    let mut r = IoRequest::new(IoType::Read, 0, 4);
    r.bufs.push(IoBuf::heap(3 * BS as usize));
    r.bufs.push(IoBuf::heap(BS as usize));
    let mut done = run_one(&ch, r);
    assert_bytes_eq(&payload(&done), &data, "read back split");
    let mut first = done.req.bufs.remove(0);
    first.zero();
    assert!(first.iter().all(|&b| b == 0), "zero() cleared what the split read wrote");
    drop((ch, desc, done));
    unregister(name, None).unwrap();
}
