//! Data integrity of the base modules: malloc, null and uring, with single and vectored requests,
//! from one and two cores.

mod common;

use common::*;
use ferrite_bdev::{unregister, Bdev, BdevError, IoRequest, IoStatus, IoType};
use ferrite_modules::malloc::{self, MallocOpts};
use ferrite_modules::null::{self, NullOpts};
use ferrite_modules::uring::{self, UringOpts};
use ferrite_reactor::{alloc_buf, ReactorMode};
use std::os::unix::fs::FileExt;

/// Applies a write of `data` at block `offset` to the model.
fn put(model: &mut [u8], bs: usize, offset: u64, data: &[u8]) {
    let off = offset as usize * bs;
    model[off..off + data.len()].copy_from_slice(data);
}

/// Writes done on reactor 0: single and vectored (2 and 3 buffers), overlapping, at both ends.
/// Returns the expected content of the bdev.
async fn write_mix(ch: &ferrite_bdev::IoChannel, num_blocks: u64, bs: usize) -> Vec<u8> {
    let mut model = vec![0u8; num_blocks as usize * bs];
    let singles: [(u64, u64); 5] = [(0, 8), (7, 1), (100, 16), (num_blocks - 1, 1), (num_blocks - 9, 4)];
    for (i, &(off, nb)) in singles.iter().enumerate() {
        let data = pattern(100 + i as u64, nb as usize * bs);
        io_ok(ch, IoRequest::write(off, nb, buf_from(&data))).await;
        put(&mut model, bs, off, &data);
    }
    // Vectored: buffer lengths are multiples of 512 (not necessarily of the block size).
    let vecs: [(u64, u64, &[usize]); 3] = [
        (20, 7, &[bs, 2 * bs, 4 * bs]),
        (40, 6, &[2 * bs, 4 * bs]),
        (3, 2, &[512, 2 * bs - 512]), // overlaps the first single write
    ];
    for (i, &(off, nb, lens)) in vecs.iter().enumerate() {
        let data = pattern(200 + i as u64, nb as usize * bs);
        io_ok(ch, vectored(IoType::Write, off, nb, bufs_from(&data, lens))).await;
        put(&mut model, bs, off, &data);
    }
    model
}

/// Reads the whole bdev with one request and with a vectored one, and compares with `model`.
async fn check_all(ch: &ferrite_bdev::IoChannel, model: &[u8], what: &str) {
    let nb = ch.num_blocks();
    let bs = ch.block_size() as usize;
    let got = io_ok(ch, IoRequest::read(0, nb, alloc_buf(model.len()))).await;
    assert_bytes_eq(&got, model, &format!("{what}: single read"));
    let lens = [512, 3 * bs - 512, model.len() - 3 * bs];
    let bufs = lens.iter().map(|&n| buf_filled(n, 0xee)).collect();
    let got = io_ok(ch, vectored(IoType::Read, 0, nb, bufs)).await;
    assert_bytes_eq(&got, model, &format!("{what}: vectored read"));
}

fn malloc_round_trip(name: &'static str, block_size: u32) {
    let e = engine(2, ReactorMode::Interrupt);
    let bs = block_size as usize;
    malloc::create(MallocOpts {
        name: Some(name.into()),
        num_blocks: 256,
        block_size,
        uuid: None,
        ..Default::default()
    })
    .unwrap();
    let model = run(&e, 0, move || async move {
        let desc = Bdev::open(name, true, || {}).unwrap();
        let ch = desc.channel().unwrap();
        let model = write_mix(&ch, 256, bs).await;
        check_all(&ch, &model, "reactor 0").await;
        // Small reads at odd places.
        for (off, nb) in [(7u64, 1u64), (19, 3), (255, 1), (44, 3)] {
            let got = io_ok(&ch, IoRequest::read(off, nb, alloc_buf(nb as usize * bs))).await;
            assert_bytes_eq(&got, &model[off as usize * bs..(off + nb) as usize * bs], "small read");
        }
        model
    });
    // Another core, through another descriptor and channel, sees the same data and writes.
    let m = model.clone();
    let model = run(&e, 1, move || async move {
        let desc = Bdev::open(name, true, || {}).unwrap();
        let ch = desc.channel().unwrap();
        check_all(&ch, &m, "reactor 1").await;
        let mut m = m;
        let data = pattern(300, 10 * bs);
        io_ok(&ch, vectored(IoType::Write, 50, 10, bufs_from(&data, &[bs, 5 * bs, 4 * bs]))).await;
        put(&mut m, bs, 50, &data);
        m
    });
    run(&e, 0, move || async move {
        let desc = Bdev::open(name, false, || {}).unwrap();
        check_all(&desc.channel().unwrap(), &model, "reactor 0 after reactor 1 wrote").await;
    });
    unregister(name, Some("malloc")).unwrap();
    shutdown(e);
}

#[test]
fn malloc_data_round_trips_across_cores() {
    malloc_round_trip("data_malloc_512", 512);
}

#[test]
fn malloc_4k_blocks_with_sub_block_buffers() {
    malloc_round_trip("data_malloc_4096", 4096);
}

#[test]
fn malloc_large_requests() {
    let e = engine(1, ReactorMode::Adaptive);
    const NAME: &str = "data_malloc_large";
    // 4 MiB; requests beyond the pool's large class (128 KiB) get heap buffers.
    malloc::create(MallocOpts {
        name: Some(NAME.into()),
        num_blocks: 8192,
        block_size: 512,
        uuid: None,
        ..Default::default()
    })
    .unwrap();
    run(&e, 0, || async {
        let desc = Bdev::open(NAME, true, || {}).unwrap();
        let ch = desc.channel().unwrap();
        let big = pattern(1, 1 << 20);
        io_ok(&ch, IoRequest::write(1000, 2048, buf_from(&big))).await;
        let got = io_ok(&ch, IoRequest::read(1000, 2048, alloc_buf(1 << 20))).await;
        assert_bytes_eq(&got, &big, "1 MiB");
        let whole = io_ok(&ch, IoRequest::read(0, 8192, alloc_buf(4 << 20))).await;
        assert!(whole[..1000 * 512].iter().all(|&b| b == 0), "before the write: a new malloc bdev reads zeroes");
        assert_bytes_eq(&whole[1000 * 512..3048 * 512], &big, "inside the write");
        assert!(whole[3048 * 512..].iter().all(|&b| b == 0), "after the write");
    });
    unregister(NAME, None).unwrap();
    shutdown(e);
}

#[test]
fn malloc_unmap_and_write_zeroes_read_back_zeroes() {
    let e = engine(1, ReactorMode::Interrupt);
    const NAME: &str = "data_malloc_zeroes";
    malloc::create(MallocOpts {
        name: Some(NAME.into()),
        num_blocks: 64,
        block_size: 512,
        uuid: None,
        ..Default::default()
    })
    .unwrap();
    run(&e, 0, || async {
        let desc = Bdev::open(NAME, true, || {}).unwrap();
        let ch = desc.channel().unwrap();
        let mut model = pattern(9, 64 * 512);
        io_ok(&ch, IoRequest::write(0, 64, buf_from(&model))).await;
        for (t, off, nb) in [
            (IoType::Unmap, 4u64, 8u64),
            (IoType::WriteZeroes, 30, 1),
            (IoType::WriteZeroes, 63, 1),
            (IoType::Unmap, 0, 1),
        ] {
            assert_eq!(io(&ch, IoRequest::no_payload(t, off, nb)).await.status, IoStatus::Success, "{t:?}");
            model[off as usize * 512..(off + nb) as usize * 512].fill(0);
        }
        check_all(&ch, &model, "after unmap/write_zeroes").await;
        // Written again after zeroing.
        let data = pattern(10, 8 * 512);
        io_ok(&ch, IoRequest::write(4, 8, buf_from(&data))).await;
        put(&mut model, 512, 4, &data);
        check_all(&ch, &model, "rewritten").await;
        // Zero everything.
        assert_eq!(io(&ch, IoRequest::no_payload(IoType::WriteZeroes, 0, 64)).await.status, IoStatus::Success);
        check_all(&ch, &[0u8; 64 * 512], "all zeroed").await;
    });
    unregister(NAME, None).unwrap();
    shutdown(e);
}

#[test]
fn null_reads_zeroes_and_accepts_writes() {
    let e = engine(2, ReactorMode::Interrupt);
    const NAME: &str = "data_null";
    let b = null::create(NullOpts {
        name: NAME.into(),
        num_blocks: 1 << 30,
        block_size: 4096,
        uuid: None,
        ..Default::default()
    })
    .unwrap();
    assert_eq!(b.module(), "null");
    for r in 0..2 {
        run(&e, r, || async {
            let desc = Bdev::open(NAME, true, || {}).unwrap();
            let ch = desc.channel().unwrap();
            io_ok(&ch, IoRequest::write(5, 2, buf_filled(8192, 0x77))).await;
            let got = io_ok(&ch, IoRequest::read(5, 2, buf_filled(8192, 0xab))).await;
            assert!(got.iter().all(|&b| b == 0), "null read left old bytes in the buffer");
            let bufs = [buf_filled(512, 0xcd), buf_filled(3584, 0xcd), buf_filled(4096, 0xcd)].into_iter().collect();
            let got = io_ok(&ch, vectored(IoType::Read, (1 << 30) - 2, 2, bufs)).await;
            assert_eq!(got.len(), 8192);
            assert!(got.iter().all(|&b| b == 0), "null vectored read left old bytes");
            for t in [IoType::WriteZeroes, IoType::Reset] {
                assert_eq!(io(&ch, IoRequest::no_payload(t, 9, 1)).await.status, IoStatus::Success, "{t:?}");
            }
            // As SPDK's null bdev: no flush, no unmap.
            for t in [IoType::Flush, IoType::Unmap] {
                assert_eq!(io(&ch, IoRequest::no_payload(t, 9, 1)).await.status, IoStatus::Unsupported, "{t:?}");
            }
            // Beyond the pool's large class: a heap buffer, dirtied after allocation.
            let got = io_ok(&ch, IoRequest::read(100, 64, buf_filled(256 * 1024, 0xab))).await;
            assert!(got.iter().all(|&b| b == 0), "null read into a dirty heap buffer");
            let c = io(&ch, IoRequest::read(1 << 30, 1, buf_filled(4096, 0xab))).await;
            assert_eq!(c.status, IoStatus::OutOfRange);
            assert!(payload(&c).iter().all(|&b| b == 0xab));
        });
    }
    unregister(NAME, Some("null")).unwrap();
    shutdown(e);
}

#[test]
fn null_zeroes_a_buffer_filled_by_another_bdev() {
    let e = engine(1, ReactorMode::Interrupt);
    const NULL: &str = "data_null_reuse";
    const MALLOC: &str = "data_malloc_reuse";
    null::create(NullOpts { name: NULL.into(), num_blocks: 1024, block_size: 512, uuid: None, ..Default::default() })
        .unwrap();
    malloc::create(MallocOpts {
        name: Some(MALLOC.into()),
        num_blocks: 1024,
        block_size: 512,
        uuid: None,
        ..Default::default()
    })
    .unwrap();
    run(&e, 0, || async {
        let (nd, md) = (Bdev::open(NULL, true, || {}).unwrap(), Bdev::open(MALLOC, true, || {}).unwrap());
        let (nch, mch) = (nd.channel().unwrap(), md.channel().unwrap());
        let data = pattern(4, 512 * 512);
        io_ok(&mch, IoRequest::write(0, 512, buf_from(&data))).await;
        for (len, what) in [(4096usize, "small pooled"), (64 * 1024, "large pooled"), (256 * 1024, "heap")] {
            let nb = (len / 512) as u64;
            // A buffer that null zeroes, then malloc fills (through its raw pointer), then null
            // reads into again: the second null read must zero it again.
            let mut c = io(&nch, IoRequest::read(0, nb, buf_filled(len, 0x11))).await;
            assert!(payload(&c).iter().all(|&b| b == 0), "{what}: first null read");
            let buf = c.take_req().bufs.into_iter().next().unwrap();
            let mut c = io(&mch, IoRequest::read(0, nb, buf)).await;
            assert_eq!(c.status, IoStatus::Success);
            assert_bytes_eq(&payload(&c), &data[..len], &format!("{what}: malloc read into the reused buffer"));
            let buf = c.take_req().bufs.into_iter().next().unwrap();
            let c = io(&nch, IoRequest::read(0, nb, buf)).await;
            assert_eq!(c.status, IoStatus::Success);
            assert!(payload(&c).iter().all(|&b| b == 0), "{what}: null read after malloc filled the buffer");
        }
    });
    unregister(NULL, None).unwrap();
    unregister(MALLOC, None).unwrap();
    shutdown(e);
}

fn read_file(path: &std::path::Path) -> Vec<u8> {
    std::fs::read(path).expect("read back the backing file")
}

#[test]
fn uring_writes_reach_the_file_and_back() {
    const NAME: &str = "data_uring";
    const SIZE: usize = 4 << 20;
    let tmp = TempFile::new("uring-rw", SIZE as u64);
    // Content written behind the bdev's back before it exists must be readable through it.
    let seed = pattern(1, 64 * 1024);
    std::fs::OpenOptions::new().write(true).open(&tmp.path).unwrap().write_all_at(&seed, 1 << 20).unwrap();
    // Started first: the bdev is the engine's (this thread is entered into it).
    let e = engine(2, ReactorMode::Interrupt);
    let b = uring::create(UringOpts {
        name: NAME.into(),
        filename: tmp.path_str(),
        block_size: None,
        uuid: None,
        ..Default::default()
    })
    .expect("uring create");
    assert_eq!((b.block_size(), b.num_blocks(), b.module()), (512, (SIZE / 512) as u64, "uring"));

    let mut model = vec![0u8; SIZE];
    put(&mut model, 1, 1 << 20, &seed);
    let m = model.clone();
    let model_r0 = run(&e, 0, move || async move {
        let desc = Bdev::open(NAME, true, || {}).unwrap();
        let ch = desc.channel().unwrap();
        let got = io_ok(&ch, IoRequest::read(2048, 128, alloc_buf(64 * 1024))).await;
        assert_bytes_eq(&got, &m[1 << 20..(1 << 20) + 65536], "content written with std::fs");
        let mut m = m;
        let nb = (SIZE / 512) as u64;
        // Single writes, pooled (fixed) buffers.
        for (i, &(off, n)) in [(0u64, 8u64), (9, 1), (nb - 1, 1), (4000, 256)].iter().enumerate() {
            let data = pattern(10 + i as u64, n as usize * 512);
            io_ok(&ch, IoRequest::write(off, n, buf_from(&data))).await;
            put(&mut m, 512, off, &data);
        }
        // Beyond the pool's large class: a heap buffer (not a fixed buffer).
        let data = pattern(20, 512 * 1024);
        io_ok(&ch, IoRequest::write(6000, 1024, buf_from(&data))).await;
        put(&mut m, 512, 6000, &data);
        // Vectored writes of 2 and 3 buffers.
        let data = pattern(21, 17 * 512);
        io_ok(&ch, vectored(IoType::Write, 100, 17, bufs_from(&data, &[4096, 512, 4096]))).await;
        put(&mut m, 512, 100, &data);
        let data = pattern(22, 16 * 512);
        io_ok(&ch, vectored(IoType::Write, 2050, 16, bufs_from(&data, &[1024, 7168]))).await;
        put(&mut m, 512, 2050, &data);
        assert_eq!(io(&ch, IoRequest::no_payload(IoType::Flush, 0, 0)).await.status, IoStatus::Success);
        check_all(&ch, &m, "uring on reactor 0").await;
        m
    });
    assert_bytes_eq(&read_file(&tmp.path), &model_r0, "file after writes on reactor 0");
    model = model_r0;

    // Reactor 1 has its own ring: it reads what reactor 0 wrote, and writes.
    let m = model.clone();
    model = run(&e, 1, move || async move {
        let desc = Bdev::open(NAME, true, || {}).unwrap();
        let ch = desc.channel().unwrap();
        check_all(&ch, &m, "uring on reactor 1").await;
        let mut m = m;
        let data = pattern(30, 24 * 512);
        io_ok(&ch, vectored(IoType::Write, 7000, 24, bufs_from(&data, &[4096, 4096, 4096]))).await;
        put(&mut m, 512, 7000, &data);
        assert_eq!(io(&ch, IoRequest::no_payload(IoType::Flush, 0, 0)).await.status, IoStatus::Success);
        m
    });
    assert_bytes_eq(&read_file(&tmp.path), &model, "file after writes on reactor 1");

    // Unmap and write_zeroes read back zeroes through the bdev and in the file.
    let m = model.clone();
    model = run(&e, 0, move || async move {
        let desc = Bdev::open(NAME, true, || {}).unwrap();
        let ch = desc.channel().unwrap();
        let mut m = m;
        for (t, off, nb) in [(IoType::Unmap, 0u64, 16u64), (IoType::WriteZeroes, 4000, 64), (IoType::Unmap, 7001, 3)] {
            assert_eq!(io(&ch, IoRequest::no_payload(t, off, nb)).await.status, IoStatus::Success, "{t:?}");
            m[off as usize * 512..(off + nb) as usize * 512].fill(0);
        }
        check_all(&ch, &m, "after unmap/write_zeroes").await;
        m
    });
    let file = read_file(&tmp.path);
    assert_eq!(file.len(), SIZE, "unmap must keep the file size");
    assert_bytes_eq(&file, &model, "file after unmap/write_zeroes");
    unregister(NAME, Some("uring")).unwrap();
    shutdown(e);
}

#[test]
fn uring_create_errors() {
    let missing = std::env::temp_dir().join(format!("ferrite-bdev-test-missing-{}", std::process::id()));
    let missing = missing.to_str().unwrap().to_string();
    let opts = |name: &str, filename: &str, block_size| UringOpts {
        name: name.into(),
        filename: filename.into(),
        block_size,
        uuid: None,
        ..Default::default()
    };
    match uring::create(opts("data_uring_missing", &missing, None)) {
        Err(BdevError::Errno(e, m)) => {
            assert_eq!(e, libc::ENOENT, "as SPDK: -ENOENT");
            assert!(m.contains(&missing), "the error names the path: {m}");
        }
        Err(e) => panic!("missing file: expected ENOENT, got {e:?}"),
        Ok(_) => panic!("created a uring bdev on a missing file"),
    }
    let dir = std::env::temp_dir().to_str().unwrap().to_string();
    match uring::create(opts("data_uring_dir", &dir, None)) {
        Err(BdevError::Errno(_, m)) | Err(BdevError::Invalid(m)) => {
            assert!(m.contains(&dir), "the error names the path: {m}")
        }
        other => panic!("a directory: expected an error, got {:?}", other.map(|b| b.name().to_string())),
    }
    let tmp = TempFile::new("uring-errors", 1 << 20);
    let path = tmp.path_str();
    for bs in [256, 1, 511, 1000, 131072] {
        match uring::create(opts("data_uring_bad_bs", &path, Some(bs))) {
            Err(BdevError::Invalid(_)) => {}
            other => panic!("block_size {bs}: expected Invalid, got {:?}", other.map(|b| b.name().to_string())),
        }
    }
    assert!(ferrite_bdev::lookup("data_uring_bad_bs").is_none());
    let mut o = opts("data_uring_bad_uuid", &path, None);
    o.uuid = Some("nope".into());
    assert!(matches!(uring::create(o), Err(BdevError::Invalid(_))));

    let empty = TempFile::new("uring-empty", 0);
    assert!(matches!(uring::create(opts("data_uring_empty", &empty.path_str(), None)), Err(BdevError::Invalid(_))));
    let tiny = TempFile::new("uring-tiny", 4000);
    assert!(matches!(uring::create(opts("data_uring_tiny", &tiny.path_str(), Some(4096))), Err(BdevError::Invalid(_))));

    let b = uring::create(opts("data_uring_4k", &path, Some(4096))).unwrap();
    assert_eq!((b.block_size(), b.num_blocks()), (4096, 256));
    assert_eq!(b.backend().driver_specific()["uring"]["filename"], path.as_str());
    assert!(matches!(uring::create(opts("data_uring_4k", &path, None)), Err(BdevError::Exists(_))));
    let b0 = uring::create(opts("data_uring_default", &path, Some(0))).unwrap();
    assert_eq!((b0.block_size(), b0.num_blocks()), (512, 2048));
    unregister("data_uring_4k", Some("uring")).unwrap();
    unregister("data_uring_default", Some("uring")).unwrap();
}

/// Zero-copy reads: malloc lends its memory (read-only views that outlive the bdev's removal);
/// null lends views of one mapping of zeroes (several for a read longer than it); uring cannot
/// lend, so the bdev layer reads into a pool buffer instead. All return the data.
#[test]
fn zero_copy_reads_lend_memory_or_fall_back() {
    let e = engine(1, ReactorMode::Interrupt);
    const M: &str = "data_zcopy_malloc";
    const N: &str = "data_zcopy_null";
    const U: &str = "data_zcopy_uring";
    let tmp = TempFile::new("zcopy-uring", 64 * 512);
    let seed = pattern(5, 64 * 512);
    std::fs::OpenOptions::new().write(true).open(&tmp.path).unwrap().write_all_at(&seed, 0).unwrap();
    uring::create(UringOpts { name: U.into(), filename: tmp.path_str(), block_size: None, ..Default::default() })
        .unwrap();
    malloc::create(MallocOpts {
        name: Some(M.into()),
        num_blocks: 64,
        block_size: 512,
        optimal_io_boundary: Some(16),
        uuid: None,
        ..Default::default()
    })
    .unwrap();
    null::create(NullOpts { name: N.into(), num_blocks: 8192, block_size: 512, uuid: None, ..Default::default() })
        .unwrap();
    let want_u = seed[2 * 512..5 * 512].to_vec();
    run(&e, 0, move || async move {
        let desc = Bdev::open(M, true, || {}).unwrap();
        let ch = desc.channel().unwrap();
        let data = pattern(9, 8 * 512);
        io_ok(&ch, IoRequest::write(4, 8, buf_from(&data))).await;
        let c = io(&ch, IoRequest::read_zcopy(4, 8)).await;
        assert_eq!(c.status, IoStatus::Success);
        assert!(c.req.bufs.iter().all(|b| b.is_lent()), "malloc lends its memory");
        assert_bytes_eq(&payload(&c), &data, "zero-copy read of malloc");
        // Across its optimal I/O boundary (16 blocks, split): read into a buffer and split,
        // as lent views of the pieces could not be put together.
        io_ok(&ch, IoRequest::write(12, 8, buf_from(&data))).await;
        let across = io(&ch, IoRequest::read_zcopy(12, 8)).await;
        assert_eq!(across.status, IoStatus::Success);
        assert!(!across.req.bufs.iter().any(|b| b.is_lent()), "a split read is not lent");
        assert_bytes_eq(&payload(&across), &data, "zero-copy read across the boundary");
        let after = io(&ch, IoRequest::read_zcopy(16, 4)).await;
        assert!(after.req.bufs.iter().all(|b| b.is_lent()), "within the boundary: lent");
        assert_bytes_eq(&payload(&after), &data[4 * 512..], "zero-copy read after the boundary");
        // A lent view keeps the memory mapped after the bdev is gone.
        let held = c;
        drop(ch);
        drop(desc);
        unregister(M, None).unwrap().await.unwrap();
        assert!(ferrite_bdev::lookup(M).is_none(), "bdev gone");
        assert_bytes_eq(&payload(&held), &data, "lent view after the bdev's removal");

        let desc = Bdev::open(N, true, || {}).unwrap();
        let ch = desc.channel().unwrap();
        io_ok(&ch, IoRequest::write(0, 8, buf_from(&data))).await;
        let c = io(&ch, IoRequest::read_zcopy(0, 3)).await;
        assert_eq!(c.status, IoStatus::Success);
        assert_eq!(c.req.bufs.len(), 1);
        assert!(c.req.bufs[0].is_lent(), "null lends its zeroes");
        assert_eq!(payload(&c), vec![0u8; 3 * 512]);
        // Longer than the mapping of zeroes (1 MiB): several views of it.
        let c = io(&ch, IoRequest::read_zcopy(1, 2049 + 2048)).await;
        assert_eq!(c.status, IoStatus::Success);
        assert_eq!(c.req.bufs.iter().map(|b| b.len()).collect::<Vec<_>>(), vec![1 << 20, 1 << 20, 512]);
        assert!(payload(&c).iter().all(|&b| b == 0), "null reads zeroes");
        // A read into the caller's buffer zeroes what it held.
        let got = io_ok(&ch, IoRequest::read(0, 8, buf_from(&data))).await;
        assert_eq!(got, vec![0u8; 8 * 512]);
        drop(ch);
        drop(desc);
        unregister(N, None).unwrap().await.unwrap();

        let desc = Bdev::open(U, false, || {}).unwrap();
        let ch = desc.channel().unwrap();
        let c = io(&ch, IoRequest::read_zcopy(2, 3)).await;
        assert_eq!(c.status, IoStatus::Success);
        assert_eq!(c.req.bufs.len(), 1);
        assert!(!c.req.bufs[0].is_lent(), "uring reads into a pool buffer");
        assert_bytes_eq(&payload(&c), &want_u, "zero-copy read of uring");
        drop(ch);
        drop(desc);
        unregister(U, None).unwrap().await.unwrap();
    });
    shutdown(e);
}

/// A memfd-backed region mapped shared, as a vhost target maps guest memory; unmapped on drop.
struct GuestMemory(std::ptr::NonNull<u8>, usize);
// SAFETY: plain shared memory; the test coordinates who touches which bytes.
unsafe impl Send for GuestMemory {}
// SAFETY: as above.
unsafe impl Sync for GuestMemory {}
impl Drop for GuestMemory {
    fn drop(&mut self) {
        // SAFETY: the mapping made below; no view of it is left.
        unsafe { libc::munmap(self.0.as_ptr().cast(), self.1) };
    }
}

#[test]
fn uring_io_into_registered_guest_memory_uses_fixed_ops() {
    const NAME: &str = "data_uring_guest";
    const SIZE: usize = 4 << 20;
    const LEN: usize = 64 << 10;
    let tmp = TempFile::new("uring-guest", SIZE as u64);
    let e = engine(2, ReactorMode::Interrupt);
    uring::create(UringOpts { name: NAME.into(), filename: tmp.path_str(), ..Default::default() }).expect("create");
    // SAFETY: memfd_create, ftruncate and a shared mapping of it; checked.
    let mem = unsafe {
        let fd = libc::memfd_create(c"guest".as_ptr(), libc::MFD_CLOEXEC);
        assert!(fd >= 0);
        assert_eq!(libc::ftruncate(fd, 8 << 20), 0);
        let p = libc::mmap(std::ptr::null_mut(), 8 << 20, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0);
        assert_ne!(p, libc::MAP_FAILED);
        libc::close(fd);
        std::sync::Arc::new(GuestMemory(std::ptr::NonNull::new(p.cast()).unwrap(), 8 << 20))
    };
    // SAFETY: the mapping lives as long as the Arc given as `keep`.
    let fm = unsafe { ferrite_reactor::FixedMem::register(&e, mem.0, mem.1, mem.clone()) }.wait().unwrap();
    assert!(fm.registered().iter().all(|&r| r));
    let fm = std::sync::Arc::new(fm);
    for r in 0..e.count() {
        let fm = fm.clone();
        let (fixed_ops, pooled, ok) = run(&e, r, move || async move {
            let desc = Bdev::open(NAME, true, || {}).unwrap();
            let ch = desc.channel().unwrap();
            let local = fm.local().unwrap();
            let data = pattern(40 + r as u64, LEN);
            // SAFETY: nothing else touches these bytes of the region.
            let (mut src, dst) = unsafe { (local.view(r << 20, LEN), local.view((4 + r) << 20, LEN)) };
            src.copy_from_slice(&data);
            let (ops0, pooled0) = (
                ferrite_reactor::with_ring(|ring| ring.fixed_ops()),
                ferrite_reactor::buf_pool().unwrap().stats().pooled,
            );
            let blocks = (LEN / 512) as u64;
            io_ok(&ch, IoRequest::write(128 * r as u64, blocks, src)).await;
            let got = io_ok(&ch, IoRequest::read(128 * r as u64, blocks, dst)).await;
            (
                ferrite_reactor::with_ring(|ring| ring.fixed_ops()) - ops0,
                ferrite_reactor::buf_pool().unwrap().stats().pooled - pooled0,
                got == data,
            )
        });
        assert_eq!((fixed_ops, pooled, ok), (2, 0, true), "reactor {r}: fixed ops on the views themselves");
        // The read landed in guest memory.
        let want = pattern(40 + r as u64, LEN);
        // SAFETY: bytes of the mapping that no I/O touches any more.
        let seen = unsafe { std::slice::from_raw_parts(mem.0.as_ptr().add((4 + r) << 20), LEN) };
        assert_bytes_eq(seen, &want, "guest memory after the read");
    }
    drop(fm);
    unregister(NAME, None).unwrap();
    shutdown(e);
}
