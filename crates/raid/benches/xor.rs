//! Ferrite's raid5f XOR on this CPU, measured as bench/raid5f_xor/xor_isal.c measures ISA-L's
//! `xor_gen`: `srcs` sources of `len` bytes XORed into one destination, over a working set of
//! `sets` stripes, best of 5 rounds of about 0.3 s; GB/s of source bytes read.
//!
//!     cargo bench -p ferrite-raid --bench xor -- SRCS LEN SETS

use ferrite_raid::xor::{implementation, xor_raw};
use std::time::Instant;

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let srcs = args.first().copied().unwrap_or(2);
    let len = args.get(1).copied().unwrap_or(65536);
    let sets = args.get(2).copied().unwrap_or(1);
    // 4 KiB-aligned buffers, as pool buffers are.
    let layout = std::alloc::Layout::from_size_align(len, 4096).unwrap();
    let v: Vec<Vec<*mut u8>> = (0..sets)
        .map(|s| {
            (0..=srcs)
                .map(|i| {
                    // SAFETY: a non-zero layout; the memory is filled before use and lives to the end.
                    let p = unsafe { std::alloc::alloc(layout) };
                    unsafe { std::ptr::write_bytes(p, (i * 7 + s + 1) as u8, len) };
                    p
                })
                .collect()
        })
        .collect();
    let mut best = 0f64;
    for _ in 0..5 {
        let mut iters = 0usize;
        let t0 = Instant::now();
        let t = loop {
            for _ in 0..64 {
                let set = &v[iters % sets];
                let mut p = [std::ptr::null::<u8>(); 16];
                for (d, x) in p.iter_mut().zip(&set[..srcs]) {
                    *d = *x;
                }
                // SAFETY: every buffer holds `len` bytes; the destination is none of the sources.
                unsafe { xor_raw(set[srcs], &p[..srcs], len) };
                iters += 1;
            }
            let t = t0.elapsed().as_secs_f64();
            if t >= 0.3 {
                break t;
            }
        };
        best = best.max((iters * srcs * len) as f64 / t / 1e9);
    }
    println!("ferrite xor ({}) srcs {srcs} len {len} sets {sets}: {best:.2} GB/s", implementation());
}
