//! The virtio-user bdev against a real vhost-user-blk device: qemu-storage-daemon exporting a
//! raw file. Every write is read back through the bdev and, once the daemon has stopped,
//! compared with the file itself; discard and write-zeroes must reach the file.

mod common;

use common::*;
use ferrite_bdev::{Bdev, IoFlags, IoRequest, IoStatus, IoType};
use ferrite_reactor::{alloc_buf, ReactorMode};
use serde_json::{json, Value};

const BS: usize = 512;
const IMAGE_BYTES: usize = 8 << 20;
const BLOCKS: u64 = (IMAGE_BYTES / BS) as u64;

fn attach_params(name: &str, socket: &str, vq_count: u32) -> Value {
    json!({"name": name, "trtype": "user", "traddr": socket, "dev_type": "blk", "vq_count": vq_count})
}

fn put(model: &mut [u8], block: u64, data: &[u8]) {
    let at = block as usize * BS;
    model[at..at + data.len()].copy_from_slice(data);
}

fn zero(model: &mut [u8], block: u64, blocks: u64) {
    let at = block as usize * BS;
    model[at..at + blocks as usize * BS].fill(0);
}

fn vectored(io_type: IoType, block: u64, blocks: u64, bufs: ferrite_bdev::IoBufs) -> IoRequest {
    let mut r = IoRequest::new(io_type, block, blocks);
    r.bufs = bufs;
    r
}

/// Writes of every shape on reactor 0 (single, vectored, the largest transfer, one the layer
/// splits, the last block, 32 at once), each read back; returns the expected device content.
async fn writes_on_core0(name: &str, mut model: Vec<u8>) -> Vec<u8> {
    let desc = Bdev::open(name, true, || {}).unwrap();
    let ch = desc.channel().unwrap();
    let cases: [(u64, usize, &[usize]); 5] = [
        (8, 4096, &[4096]),
        (100, 4096, &[512, 1536, 2048]),
        (1000, 128 << 10, &[128 << 10]),
        (2000, 300 << 10, &[100 << 10, 200 << 10]),
        (BLOCKS - 1, 512, &[512]),
    ];
    for (i, &(block, len, lens)) in cases.iter().enumerate() {
        let data = pattern(100 + i as u64, len);
        let nb = (len / BS) as u64;
        io_ok(&ch, vectored(IoType::Write, block, nb, bufs_from(&data, lens))).await;
        put(&mut model, block, &data);
        let got = io_ok(&ch, IoRequest::read(block, nb, alloc_buf(len))).await;
        assert_bytes_eq(&got, &data, &format!("write {i} read back"));
    }
    // 32 writes in flight at once, then 32 reads.
    let base = 3000u64;
    let writes: Vec<_> = (0..32u64)
        .map(|i| {
            let data = pattern(500 + i, 4096);
            put(&mut model, base + 8 * i, &data);
            start_io(&ch, IoRequest::write(base + 8 * i, 8, buf_from(&data)))
        })
        .collect();
    for w in writes {
        assert_eq!(w.await.status, IoStatus::Success, "concurrent write");
    }
    let reads: Vec<_> = (0..32u64).map(|i| start_io(&ch, IoRequest::read(base + 8 * i, 8, alloc_buf(4096)))).collect();
    for (i, r) in reads.into_iter().enumerate() {
        let c = r.await;
        assert_eq!(c.status, IoStatus::Success);
        let at = (base as usize + 8 * i) * BS;
        assert_bytes_eq(&c.req.bufs[0], &model[at..at + 4096], "concurrent read");
    }
    io_ok(&ch, IoRequest::no_payload(IoType::Flush, 0, BLOCKS)).await;
    model
}

/// Whole-device read (split by the layer into the device's largest transfers) compared.
async fn read_all(name: &str, model: Vec<u8>, what: &'static str) -> Vec<u8> {
    let desc = Bdev::open(name, false, || {}).unwrap();
    let ch = desc.channel().unwrap();
    let got = io_ok(&ch, IoRequest::read(0, BLOCKS, alloc_buf(IMAGE_BYTES))).await;
    assert_bytes_eq(&got, &model, what);
    model
}

#[test]
fn data_reaches_the_file_through_two_queues() {
    let dir = TempDir::new("data");
    let (image, initial) = image_with_pattern(&dir.0, IMAGE_BYTES, 1);
    let Some(mut qsd) = Qsd::start(&dir.0, &image, 2) else { return };
    let side = Side::start(2, ReactorMode::Interrupt);
    let names = side.rpc("bdev_virtio_attach_controller", attach_params("vu0", &qsd.socket_str(), 2)).unwrap();
    assert_eq!(names, json!(["vu0"]), "SPDK names a blk bdev after its controller");
    let (code, msg) =
        side.rpc("bdev_virtio_attach_controller", attach_params("vu0", &qsd.socket_str(), 1)).unwrap_err();
    assert_eq!(code, -32602, "{msg}");
    assert!(msg.contains("vu0 already exists"), "{msg}");

    let info = side.rpc("bdev_get_bdevs", json!({"name": "vu0"})).unwrap();
    let b = &info[0];
    assert_eq!((b["block_size"].as_u64(), b["num_blocks"].as_u64()), (Some(BS as u64), Some(BLOCKS)));
    assert_eq!(b["product_name"], "VirtioBlk Disk");
    assert_eq!(b["driver_specific"]["virtio"]["vq_count"], 2);
    let types = &b["supported_io_types"];
    for t in ["read", "write", "flush", "unmap", "write_zeroes"] {
        assert_eq!(types[t], true, "qemu-storage-daemon serves {t}");
    }

    let model = side.run(0, move || writes_on_core0("vu0", initial));
    // Reactor 1 takes the second queue: it sees reactor 0's writes and adds its own.
    let model = side.run(1, move || async move {
        let mut model = read_all("vu0", model, "whole device from reactor 1").await;
        let desc = Bdev::open("vu0", true, || {}).unwrap();
        let ch = desc.channel().unwrap();
        let data = pattern(900, 64 << 10);
        io_ok(&ch, IoRequest::write(5000, 128, buf_from(&data))).await;
        put(&mut model, 5000, &data);
        model
    });
    // Discard and write zeroes over patterned blocks: zeroes read back.
    let model = side.run(0, move || async move {
        let mut model = model;
        let desc = Bdev::open("vu0", true, || {}).unwrap();
        let ch = desc.channel().unwrap();
        io_ok(&ch, IoRequest::no_payload(IoType::Unmap, 4096, 256)).await;
        zero(&mut model, 4096, 256);
        io_ok(&ch, IoRequest::no_payload(IoType::WriteZeroes, 6000, 72)).await;
        zero(&mut model, 6000, 72);
        for (block, blocks) in [(4096u64, 256u64), (6000, 72)] {
            let got = io_ok(&ch, IoRequest::read(block, blocks, alloc_buf(blocks as usize * BS))).await;
            assert!(got.iter().all(|&b| b == 0), "zeroes read back at block {block}");
        }
        read_all("vu0", model, "whole device after discard and write zeroes").await
    });
    // A FUA write is followed by a flush (virtio-blk has no FUA) and reads back.
    let model = side.run(0, move || async move {
        let mut model = model;
        let desc = Bdev::open("vu0", true, || {}).unwrap();
        let ch = desc.channel().unwrap();
        let data = pattern(77, 4096);
        io_ok(&ch, IoRequest::write(7000, 8, buf_from(&data)).with_flags(IoFlags::FUA)).await;
        put(&mut model, 7000, &data);
        let got = io_ok(&ch, IoRequest::read(7000, 8, alloc_buf(4096))).await;
        assert_bytes_eq(&got, &data, "FUA write read back");
        model
    });
    let specific = &side.rpc("bdev_get_bdevs", json!({"name": "vu0"})).unwrap()[0]["driver_specific"]["virtio"];
    assert_eq!(specific["fua_flushes"], 1, "one FUA write, one flush after it");
    let copied = specific["bounce_copied_bytes"].as_u64().unwrap();
    // Every payload byte crosses the bounce buffers once: the writes of reactor 0 and their
    // read-backs, 32 writes and 32 reads of 4 KiB, two whole-device reads, reactor 1's write,
    // the zeroes read back, the FUA write and its read-back.
    let shapes = 4096 + 4096 + (128 << 10) + (300 << 10) + 512;
    let expected = 2 * shapes + 64 * 4096 + 2 * IMAGE_BYTES + (64 << 10) + (256 + 72) * BS + 2 * 4096;
    assert_eq!(copied, expected as u64, "bytes bounced");

    // save_config keeps the attach; replaying it after a detach attaches again.
    let config = side.rpc("framework_get_config", json!({"name": "bdev"})).unwrap();
    let entry = config
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["method"] == "bdev_virtio_attach_controller")
        .cloned()
        .expect("the attach is in the saved config");
    assert_eq!(
        entry["params"],
        json!({"name": "vu0", "dev_type": "blk", "trtype": "user",
        "traddr": qsd.socket_str(), "vq_count": 2, "vq_size": 512})
    );
    assert_eq!(side.rpc("bdev_virtio_detach_controller", json!({"name": "vu0"})).unwrap(), json!(true));
    assert!(side.rpc("bdev_get_bdevs", json!({"name": "vu0"})).is_err(), "detached");
    let names = side.rpc("bdev_virtio_attach_controller", entry["params"].clone()).unwrap();
    assert_eq!(names, json!(["vu0"]));
    let model = side.run(0, move || read_all("vu0", model, "after re-attach"));
    side.rpc("bdev_virtio_detach_controller", json!({"name": "vu0"})).unwrap();
    side.shutdown();

    qsd.stop();
    let on_disk = std::fs::read(&image).unwrap();
    assert_bytes_eq(&on_disk, &model, "the file after the export stopped");
}

#[test]
fn a_vanished_device_fails_its_requests_and_the_bdev_stays() {
    let dir = TempDir::new("gone");
    let (image, initial) = image_with_pattern(&dir.0, IMAGE_BYTES, 2);
    let Some(mut qsd) = Qsd::start(&dir.0, &image, 1) else { return };
    let side = Side::start(1, ReactorMode::Interrupt);
    side.rpc("bdev_virtio_attach_controller", attach_params("gone0", &qsd.socket_str(), 1)).unwrap();
    let desc = side.run(0, move || async move {
        let desc = Bdev::open("gone0", true, || {}).unwrap();
        let ch = desc.channel().unwrap();
        let got = io_ok(&ch, IoRequest::read(0, 8, alloc_buf(4096))).await;
        assert_bytes_eq(&got, &initial[..4096], "read before the device goes");
        desc
    });
    // A request to a device that answers late: the reactor (interrupt mode) stops polling,
    // asks for a signal and sleeps; the completion's signal wakes it.
    qsd.freeze();
    let pid = qsd.pid();
    let thaw = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(300));
        // SAFETY: kill(2) of the test's own child.
        unsafe { libc::kill(pid, libc::SIGCONT) };
    });
    let desc = side.run(0, move || async move {
        let ch = desc.channel().unwrap();
        let c = io(&ch, IoRequest::read(8, 8, alloc_buf(4096))).await;
        assert_eq!(c.status, IoStatus::Success, "a late completion");
        desc
    });
    thaw.join().unwrap();
    let waits = &side.rpc("bdev_get_bdevs", json!({"name": "gone0"})).unwrap()[0]["driver_specific"]["virtio"]["waits"];
    assert!(waits.as_u64().unwrap() >= 1, "the channel asked for a signal: {waits}");
    // Requests handed to a frozen device stay in flight; killing it must fail them.
    qsd.freeze();
    let statuses = side.run(0, move || async move {
        let ch = desc.channel().unwrap();
        let pending: Vec<_> = (0..4u64).map(|i| start_io(&ch, IoRequest::read(8 * i, 8, alloc_buf(4096)))).collect();
        ferrite_reactor::sleep(std::time::Duration::from_millis(200)).await;
        // SAFETY: kill(2) of the test's own child.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let mut in_flight = Vec::new();
        for p in pending {
            in_flight.push(p.await.status);
        }
        // A new request fails at once.
        let late = io(&ch, IoRequest::write(0, 8, buf_from(&[7u8; 4096]))).await.status;
        (in_flight, late)
    });
    qsd.kill();
    assert_eq!(statuses.0, vec![IoStatus::Failed(libc::EIO); 4], "the requests in flight fail");
    assert_eq!(statuses.1, IoStatus::Failed(libc::EIO), "a request after the loss fails");
    let b = &side.rpc("bdev_get_bdevs", json!({"name": "gone0"})).unwrap()[0];
    assert_eq!(b["driver_specific"]["virtio"]["connected"], false, "the bdev stays, disconnected");
    assert_eq!(side.rpc("bdev_virtio_detach_controller", json!({"name": "gone0"})).unwrap(), json!(true));
    side.shutdown();
}

#[test]
fn a_reactor_beyond_vq_count_gets_no_channel_until_one_is_free() {
    let dir = TempDir::new("busy");
    let (image, initial) = image_with_pattern(&dir.0, IMAGE_BYTES, 3);
    let Some(qsd) = Qsd::start(&dir.0, &image, 2) else { return };
    let side = Side::start(2, ReactorMode::Interrupt);
    // One queue only, although the device has two.
    side.rpc("bdev_virtio_attach_controller", attach_params("busy0", &qsd.socket_str(), 1)).unwrap();
    let b = &side.rpc("bdev_get_bdevs", json!({"name": "busy0"})).unwrap()[0];
    assert_eq!(b["driver_specific"]["virtio"]["vq_count"], 1);
    // Reactor 0 holds the queue until told to let it go.
    let (release, released) = ferrite_reactor::oneshot::channel::<()>();
    let (holding, held) = std::sync::mpsc::channel::<()>();
    let holder = side.engine.run_async(0, move || async move {
        let desc = Bdev::open("busy0", false, || {}).unwrap();
        let ch = desc.channel().unwrap();
        holding.send(()).unwrap();
        let _ = released.await;
        drop(ch);
    });
    held.recv_timeout(TIMEOUT).unwrap();
    let refused = side.run(1, || async {
        let desc = Bdev::open("busy0", false, || {}).unwrap();
        desc.channel().err().map(|e| e.to_string())
    });
    let why = refused.expect("a second reactor gets no channel while the only queue is taken");
    assert!(why.contains("all 1 virtqueues are in use"), "{why}");
    release.send(());
    wait(holder);
    // The queue went back with the channel: reactor 1 now reads through it.
    side.run(1, move || async move {
        let desc = Bdev::open("busy0", false, || {}).unwrap();
        let ch = desc.channel().unwrap();
        let got = io_ok(&ch, IoRequest::read(16, 8, alloc_buf(4096))).await;
        assert_bytes_eq(&got, &initial[16 * BS..24 * BS], "read after the queue moved");
    });
    side.rpc("bdev_virtio_detach_controller", json!({"name": "busy0"})).unwrap();
    side.shutdown();
}

#[test]
fn zero_copy_reads_lend_the_bounce_buffer_until_dropped() {
    let dir = TempDir::new("zcopy");
    let (image, initial) = image_with_pattern(&dir.0, IMAGE_BYTES, 5);
    let Some(qsd) = Qsd::start(&dir.0, &image, 1) else { return };
    let side = Side::start(1, ReactorMode::Interrupt);
    // 16 entries: 5 slots of three descriptors.
    let mut params = attach_params("zc0", &qsd.socket_str(), 1);
    params["vq_size"] = json!(16);
    side.rpc("bdev_virtio_attach_controller", params).unwrap();
    let b = &side.rpc("bdev_get_bdevs", json!({"name": "zc0"})).unwrap()[0];
    assert_eq!(b["supported_io_types"]["zcopy"], true);
    let image_data = initial.clone();
    side.run(0, move || async move {
        let initial = image_data;
        let desc = Bdev::open("zc0", false, || {}).unwrap();
        let ch = desc.channel().unwrap();
        let want = |block: u64, blocks: u64| &initial[block as usize * BS..(block + blocks) as usize * BS];
        // Four times the slots, each view dropped before the next read: slots come back.
        for i in 0..20u64 {
            let got = io_ok(&ch, IoRequest::read_zcopy(8 * i, 8)).await;
            assert_bytes_eq(&got, want(8 * i, 8), "zero-copy read");
        }
        // Five views held: a sixth read waits for a slot until one is dropped.
        let mut held = Vec::new();
        for i in 0..5u64 {
            let c = io(&ch, IoRequest::read_zcopy(100 + 8 * i, 8)).await;
            assert_eq!(c.status, IoStatus::Success);
            assert!(c.req.bufs[0].is_lent(), "the bounce buffer itself is lent");
            held.push(c);
        }
        let sixth = start_io(&ch, IoRequest::read_zcopy(200, 8));
        ferrite_reactor::sleep(std::time::Duration::from_millis(100)).await;
        assert!(!sixth.is_done(), "no slot is free while every view is held");
        drop(held.pop());
        let c = sixth.await;
        assert_eq!(c.status, IoStatus::Success);
        assert_bytes_eq(&c.req.bufs[0], want(200, 8), "the read that waited for a slot");
        for (i, c) in held.iter().enumerate() {
            assert_bytes_eq(&c.req.bufs[0], want(100 + 8 * i as u64, 8), "a held view is unchanged");
        }
        drop(held);
        // Longer than a slot: served as a plain read into a pool buffer (copied).
        let got = io_ok(&ch, IoRequest::read_zcopy(1000, 512)).await;
        assert_bytes_eq(&got, want(1000, 512), "a zero-copy read longer than a slot");
    });
    let v = &side.rpc("bdev_get_bdevs", json!({"name": "zc0"})).unwrap()[0]["driver_specific"]["virtio"];
    assert_eq!(v["lent_bytes"], (20 + 5 + 1) * 4096, "{v}");
    assert_eq!(v["bounce_copied_bytes"], 512 * BS, "{v}");
    side.rpc("bdev_virtio_detach_controller", json!({"name": "zc0"})).unwrap();
    side.shutdown();
}
