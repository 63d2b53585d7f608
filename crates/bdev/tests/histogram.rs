//! Latency histograms: per-core counts merged on request in SPDK's layout, the I/O type filter,
//! disabling, and the base64 form decoded as SPDK's scripts/histogram.py decodes it.

mod common;

use common::*;
use ferrite_bdev::histogram::{self, Histogram};
use ferrite_bdev::{unregister, Bdev, IoRequest, IoType};
use ferrite_modules::malloc::{self, MallocOpts};
use ferrite_reactor::{Engine, ReactorMode};

fn enable(e: &Engine, b: &Bdev, cfg: Option<(Option<IoType>, u32, u64, u64)>) {
    let (e2, b) = (e.clone(), b.clone());
    run(e, 0, move || async move { histogram::enable(&e2, &b, cfg).await });
}

fn merged(e: &Engine, b: &Bdev) -> Option<Histogram> {
    let (e2, b) = (e.clone(), b.clone());
    run(e, 0, move || async move { histogram::merged(&e2, &b).await })
}

/// `n` reads and `n` writes of one block on reactor `core`.
fn rw(e: &Engine, core: usize, name: &'static str, n: u64) {
    run(e, core, move || async move {
        let d = Bdev::open(name, true, || {}).unwrap();
        let ch = d.channel().unwrap();
        for i in 0..n {
            io_ok(&ch, IoRequest::write(i, 1, buf_filled(512, 3))).await;
            io_ok(&ch, IoRequest::read(i, 1, buf_filled(512, 0))).await;
        }
    });
}

/// Decodes base64 (what Python's base64.b64decode does for SPDK's output).
fn b64decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let mut out = Vec::new();
    for q in s.as_bytes().chunks(4) {
        let pad = q.iter().filter(|&&c| c == b'=').count();
        let n = q.iter().filter(|&&c| c != b'=').fold(0u32, |n, &c| n << 6 | val(c) as u32) << (6 * pad);
        out.extend_from_slice(&n.to_be_bytes()[1..4 - pad]);
    }
    out
}

/// SPDK's scripts/histogram.py, step for step: (start, end, count) of each non-empty bucket in
/// ticks. (The script stops one range short of max_range; so does this.)
fn histogram_py(b64: &str, granularity: u32, min_range: u32, max_range: u32) -> Vec<(u64, u64, u64)> {
    let data = b64decode(b64);
    let mut out = Vec::new();
    let mut bucket = 0u64;
    for i in 0..(max_range - min_range) {
        for j in 0..(1u64 << granularity) {
            let index = (((i as u64) << granularity) + j) as usize * 8;
            let count = u64::from_le_bytes(data[index..index + 8].try_into().unwrap());
            let last = bucket;
            bucket = if i > 0 {
                (1u64 << (i + granularity + min_range - 1)) + ((j + 1) << (i + min_range - 1))
            } else {
                (j + 1) << min_range
            };
            if count > 0 {
                out.push((last, bucket, count));
            }
        }
    }
    out
}

#[test]
fn per_core_histograms_merge_filter_and_disable() {
    let e = engine(2, ReactorMode::Adaptive);
    let b = malloc::create(MallocOpts {
        name: Some("hist0".into()),
        num_blocks: 256,
        block_size: 512,
        ..Default::default()
    })
    .unwrap();
    assert!(merged(&e, &b).is_none(), "disabled by default");
    rw(&e, 0, "hist0", 10); // not counted: disabled

    enable(&e, &b, Some((None, 7, 0, u64::MAX)));
    rw(&e, 0, "hist0", 100);
    rw(&e, 1, "hist0", 50);
    let h = merged(&e, &b).unwrap();
    assert_eq!(h.total(), 300, "every read and write of both cores, none from before");
    assert_eq!((h.granularity(), h.min_range(), h.max_range()), (7, 0, 57));

    // Only writes.
    enable(&e, &b, Some((Some(IoType::Write), 7, 0, u64::MAX)));
    rw(&e, 1, "hist0", 20);
    assert_eq!(merged(&e, &b).unwrap().total(), 20, "only the writes, counted from zero");

    // Bounded ranges, as the RPC's defaults (1 µs to 120 s).
    let tps = ferrite_reactor::tsc::ticks_per_sec();
    let (lo, hi) = (tps / 1_000_000, tps * 120);
    enable(&e, &b, Some((None, 7, lo, hi)));
    rw(&e, 0, "hist0", 5);
    let h = merged(&e, &b).unwrap();
    assert_eq!(h.total(), 10);
    let want = Histogram::new(7, lo, hi).unwrap();
    assert_eq!((h.min_range(), h.max_range()), (want.min_range(), want.max_range()));

    // histogram.py reads back what was counted.
    let buckets = histogram_py(&h.to_base64(), h.granularity(), h.min_range(), h.max_range());
    assert_eq!(buckets.iter().map(|b| b.2).sum::<u64>(), 10);
    assert!(buckets.iter().all(|(s, e, _)| s < e));

    enable(&e, &b, None);
    assert!(merged(&e, &b).is_none(), "disabled again");
    unregister("hist0", None).unwrap();
    shutdown(e);
}

#[test]
fn histogram_py_decodes_each_value_into_its_bucket() {
    let mut h = Histogram::new(7, 0, u64::MAX).unwrap();
    let values = [0u64, 1, 127, 128, 255, 256, 1000, 5000, 123_456, 10_000_000];
    for v in values {
        h.tally(v);
    }
    let decoded = histogram_py(&h.to_base64(), 7, 0, 57);
    assert_eq!(decoded.len(), values.len());
    for (v, (start, end, count)) in values.iter().zip(decoded.iter()) {
        assert_eq!(*count, 1);
        assert!(start <= v && v < end, "{v} decoded into [{start}, {end})");
    }
}
