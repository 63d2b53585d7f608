//! XOR parity for raid5f (what SPDK's raid5f asks of `spdk_accel_submit_xor`, whose software
//! path is ISA-L's `xor_gen`): the destination becomes the XOR of the sources.
//!
//! One pass over memory: for each block of four vector registers the sources are loaded in turn
//! and XORed, and the result stored once, as ISA-L's `xor_gen_avx`/`xor_gen_avx512` do.
//! AVX-512 or AVX2 when the CPU has it (detected at run time, once), SSE2 otherwise (every
//! x86_64 CPU), then 8-byte words and single bytes for the tail; plain `u64` words on other
//! architectures. The destination may be
//! one of the sources (XOR in place). See docs/perf-log/2026-11-29-raid5f-xor.md for its speed
//! against ISA-L's on this project's machines.

use ferrite_bdev::IoBufs;

/// Most sources of one XOR (a RAID's members).
pub const MAX_SOURCES: usize = 256;

/// `dst` = XOR of `srcs` (each as long as `dst`).
///
/// # Panics
/// If a source's length differs from `dst`'s, or there are no sources or more than
/// [`MAX_SOURCES`].
pub fn xor_gen(dst: &mut [u8], srcs: &[&[u8]]) {
    assert!(!srcs.is_empty() && srcs.len() <= MAX_SOURCES, "1 to {MAX_SOURCES} sources");
    assert!(srcs.iter().all(|s| s.len() == dst.len()), "every source is as long as the destination");
    let mut p = [std::ptr::null::<u8>(); MAX_SOURCES];
    for (d, s) in p.iter_mut().zip(srcs) {
        *d = s.as_ptr();
    }
    // SAFETY: every pointer is valid for `dst.len()` bytes (checked above); `dst` is borrowed
    // mutably, so no source aliases it.
    unsafe { xor_raw(dst.as_mut_ptr(), &p[..srcs.len()], dst.len()) }
}

/// `dst` = XOR of the `len` bytes at each of `srcs`. `dst` may be one of the sources.
///
/// # Safety
/// Every source must be valid for reads, and `dst` for writes, of `len` bytes; no source may
/// overlap `dst` other than by being exactly it.
#[inline]
pub unsafe fn xor_raw(dst: *mut u8, srcs: &[*const u8], len: usize) {
    debug_assert!(!srcs.is_empty(), "an XOR has sources");
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx512() {
            // SAFETY: the CPU has AVX-512F; the caller's promise covers the memory.
            return unsafe { x86::xor_avx512(dst, srcs, len) };
        }
        if has_avx2() {
            // SAFETY: the CPU has AVX2; the caller's promise covers the memory.
            return unsafe { x86::xor_avx2(dst, srcs, len) };
        }
        // SAFETY: SSE2 is part of x86_64; the caller's promise covers the memory.
        unsafe { x86::xor_sse2(dst, srcs, len) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: the caller's promise covers the memory.
    unsafe {
        xor_words(dst, srcs, 0, len)
    }
}

/// True if the CPU has AVX2 (detected once; `is_x86_feature_detected!` caches it).
#[cfg(target_arch = "x86_64")]
#[inline]
fn has_avx2() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
}

/// True if the CPU has AVX-512F (detected once).
#[cfg(target_arch = "x86_64")]
#[inline]
fn has_avx512() -> bool {
    std::arch::is_x86_feature_detected!("avx512f")
}

/// The name of the XOR code this CPU runs ("avx512", "avx2", "sse2" or "u64"), for reports.
pub fn implementation() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx512() {
            "avx512"
        } else if has_avx2() {
            "avx2"
        } else {
            "sse2"
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        "u64"
    }
}

/// Bytes `[from, len)`: 8-byte words, then single bytes.
///
/// # Safety
/// As [`xor_raw`].
#[inline]
unsafe fn xor_words(dst: *mut u8, srcs: &[*const u8], from: usize, len: usize) {
    let mut i = from;
    // SAFETY (whole body): offsets stay below `len`, as the caller's pointers allow; unaligned
    // accesses are explicit.
    unsafe {
        while i + 8 <= len {
            let mut a = (srcs[0].add(i) as *const u64).read_unaligned();
            for s in &srcs[1..] {
                a ^= (s.add(i) as *const u64).read_unaligned();
            }
            (dst.add(i) as *mut u64).write_unaligned(a);
            i += 8;
        }
        while i < len {
            let mut a = *srcs[0].add(i);
            for s in &srcs[1..] {
                a ^= *s.add(i);
            }
            *dst.add(i) = a;
            i += 1;
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// AVX-512: 256 bytes per step in four registers, then the AVX2 code for the rest.
    ///
    /// # Safety
    /// The CPU has AVX-512F (and so AVX2), and as [`super::xor_raw`].
    #[target_feature(enable = "avx512f,avx2")]
    pub(super) unsafe fn xor_avx512(dst: *mut u8, srcs: &[*const u8], len: usize) {
        let (first, rest) = srcs.split_first().expect("an XOR has sources");
        let mut i = 0usize;
        // SAFETY (whole body): every access is at an offset below `len`.
        unsafe {
            let ld = |p: *const u8| _mm512_loadu_si512(p as *const __m512i);
            while i + 256 <= len {
                let p = first.add(i);
                let (mut a, mut b, mut c, mut d) = (ld(p), ld(p.add(64)), ld(p.add(128)), ld(p.add(192)));
                for s in rest {
                    let p = s.add(i);
                    a = _mm512_xor_si512(a, ld(p));
                    b = _mm512_xor_si512(b, ld(p.add(64)));
                    c = _mm512_xor_si512(c, ld(p.add(128)));
                    d = _mm512_xor_si512(d, ld(p.add(192)));
                }
                let o = dst.add(i) as *mut __m512i;
                _mm512_storeu_si512(o, a);
                _mm512_storeu_si512(o.add(1), b);
                _mm512_storeu_si512(o.add(2), c);
                _mm512_storeu_si512(o.add(3), d);
                i += 256;
            }
            if i < len {
                let at: SmallPtrs = SmallPtrs::offset(srcs, i);
                xor_avx2(dst.add(i), at.get(srcs.len()), len - i);
            }
        }
    }

    /// Source pointers moved by a few bytes, on the stack.
    struct SmallPtrs([*const u8; super::MAX_SOURCES]);

    impl SmallPtrs {
        fn offset(srcs: &[*const u8], by: usize) -> Self {
            let mut a = [std::ptr::null::<u8>(); super::MAX_SOURCES];
            for (d, s) in a.iter_mut().zip(srcs) {
                *d = s.wrapping_add(by);
            }
            SmallPtrs(a)
        }
        fn get(&self, n: usize) -> &[*const u8] {
            &self.0[..n]
        }
    }

    /// AVX2: 128 bytes per step in four registers, then 32-byte steps, then the word tail.
    ///
    /// # Safety
    /// The CPU has AVX2, and as [`super::xor_raw`].
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn xor_avx2(dst: *mut u8, srcs: &[*const u8], len: usize) {
        let (first, rest) = srcs.split_first().expect("an XOR has sources");
        let mut i = 0usize;
        // SAFETY (whole body): every access is at an offset below `len`.
        unsafe {
            let ld = |p: *const u8| _mm256_loadu_si256(p as *const __m256i);
            while i + 128 <= len {
                let p = first.add(i);
                let (mut a, mut b, mut c, mut d) = (ld(p), ld(p.add(32)), ld(p.add(64)), ld(p.add(96)));
                for s in rest {
                    let p = s.add(i);
                    a = _mm256_xor_si256(a, ld(p));
                    b = _mm256_xor_si256(b, ld(p.add(32)));
                    c = _mm256_xor_si256(c, ld(p.add(64)));
                    d = _mm256_xor_si256(d, ld(p.add(96)));
                }
                let o = dst.add(i) as *mut __m256i;
                _mm256_storeu_si256(o, a);
                _mm256_storeu_si256(o.add(1), b);
                _mm256_storeu_si256(o.add(2), c);
                _mm256_storeu_si256(o.add(3), d);
                i += 128;
            }
            while i + 32 <= len {
                let mut a = ld(first.add(i));
                for s in rest {
                    a = _mm256_xor_si256(a, ld(s.add(i)));
                }
                _mm256_storeu_si256(dst.add(i) as *mut __m256i, a);
                i += 32;
            }
            super::xor_words(dst, srcs, i, len)
        }
    }

    /// SSE2: 64 bytes per step in four registers, then 16-byte steps, then the word tail.
    ///
    /// # Safety
    /// As [`super::xor_raw`].
    #[target_feature(enable = "sse2")]
    pub(super) unsafe fn xor_sse2(dst: *mut u8, srcs: &[*const u8], len: usize) {
        let (first, rest) = srcs.split_first().expect("an XOR has sources");
        let mut i = 0usize;
        // SAFETY (whole body): every access is at an offset below `len`.
        unsafe {
            let ld = |p: *const u8| _mm_loadu_si128(p as *const __m128i);
            while i + 64 <= len {
                let p = first.add(i);
                let (mut a, mut b, mut c, mut d) = (ld(p), ld(p.add(16)), ld(p.add(32)), ld(p.add(48)));
                for s in rest {
                    let p = s.add(i);
                    a = _mm_xor_si128(a, ld(p));
                    b = _mm_xor_si128(b, ld(p.add(16)));
                    c = _mm_xor_si128(c, ld(p.add(32)));
                    d = _mm_xor_si128(d, ld(p.add(48)));
                }
                let o = dst.add(i) as *mut __m128i;
                _mm_storeu_si128(o, a);
                _mm_storeu_si128(o.add(1), b);
                _mm_storeu_si128(o.add(2), c);
                _mm_storeu_si128(o.add(3), d);
                i += 64;
            }
            while i + 16 <= len {
                let mut a = ld(first.add(i));
                for s in rest {
                    a = _mm_xor_si128(a, ld(s.add(i)));
                }
                _mm_storeu_si128(dst.add(i) as *mut __m128i, a);
                i += 16;
            }
            super::xor_words(dst, srcs, i, len)
        }
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn sse2_avx2_and_avx512_agree_with_bytes() {
            for n in 1..6usize {
                for len in [0usize, 1, 7, 8, 15, 16, 31, 33, 64, 127, 128, 129, 255, 256, 300, 513, 4096 + 5] {
                    let srcs: Vec<Vec<u8>> =
                        (0..n).map(|k| (0..len).map(|i| (i * 7 + k * 13 + i / 3) as u8).collect()).collect();
                    let want: Vec<u8> = (0..len).map(|i| srcs.iter().fold(0u8, |a, s| a ^ s[i])).collect();
                    let p: Vec<*const u8> = srcs.iter().map(|s| s.as_ptr()).collect();
                    let mut got = vec![0xAAu8; len];
                    // SAFETY: every buffer holds `len` bytes.
                    unsafe { super::xor_sse2(got.as_mut_ptr(), &p, len) };
                    assert_eq!(got, want, "sse2 n {n} len {len}");
                    if std::arch::is_x86_feature_detected!("avx512f") {
                        let mut got = vec![0x33u8; len];
                        // SAFETY: every buffer holds `len` bytes; the CPU has AVX-512F.
                        unsafe { super::xor_avx512(got.as_mut_ptr(), &p, len) };
                        assert_eq!(got, want, "avx512 n {n} len {len}");
                    }
                    if std::arch::is_x86_feature_detected!("avx2") {
                        let mut got = vec![0x55u8; len];
                        // SAFETY: every buffer holds `len` bytes; the CPU has AVX2.
                        unsafe { super::xor_avx2(got.as_mut_ptr(), &p, len) };
                        assert_eq!(got, want, "avx2 n {n} len {len}");
                    }
                }
            }
        }
    }
}

/// A position in a scatter-gather list: segment index and offset in it.
#[derive(Clone, Copy)]
struct Cursor {
    seg: usize,
    off: usize,
}

impl Cursor {
    /// The cursor at byte `at` of `bufs`.
    fn at(bufs: &IoBufs, mut at: usize) -> Cursor {
        for (seg, b) in bufs.iter().enumerate() {
            if at < b.len() {
                return Cursor { seg, off: at };
            }
            at -= b.len();
        }
        Cursor { seg: bufs.len(), off: 0 }
    }

    /// Bytes left in the current segment.
    fn run(&self, bufs: &IoBufs) -> usize {
        bufs[self.seg].len() - self.off
    }

    fn advance(&mut self, bufs: &IoBufs, n: usize) {
        self.off += n;
        if self.off == bufs[self.seg].len() {
            self.seg += 1;
            self.off = 0;
        }
    }
}

/// XOR over streams of one scatter-gather list: stream `k` is bytes `[k × len, (k + 1) × len)`
/// of `bufs`. Stream `dst` becomes the XOR of the streams in `srcs` (which may name `dst`
/// itself: XOR in place). Runs are cut where any stream crosses a segment end, as SPDK's
/// `spdk_ioviter` does.
///
/// # Panics
/// If a stream lies beyond `bufs`, a segment that `dst` covers is read-only, or there are no
/// sources or more than [`MAX_SOURCES`].
pub fn xor_streams(bufs: &mut IoBufs, len: usize, dst: usize, srcs: &[usize]) {
    assert!(!srcs.is_empty() && srcs.len() <= MAX_SOURCES, "1 to {MAX_SOURCES} sources");
    let total: usize = bufs.iter().map(|b| b.len()).sum();
    assert!(
        (dst.max(srcs.iter().copied().max().unwrap_or(0)) + 1) * len <= total,
        "streams of {len} bytes beyond {total}"
    );
    let mut d = Cursor::at(bufs, dst * len);
    let mut cur = [Cursor { seg: 0, off: 0 }; MAX_SOURCES];
    for (c, &s) in cur.iter_mut().zip(srcs) {
        *c = Cursor::at(bufs, s * len);
    }
    let cur = &mut cur[..srcs.len()];
    let mut p = [std::ptr::null::<u8>(); MAX_SOURCES];
    let mut left = len;
    while left > 0 {
        let mut run = left.min(d.run(bufs));
        for c in cur.iter() {
            run = run.min(c.run(bufs));
        }
        debug_assert!(run > 0, "segments have bytes");
        for (pp, c) in p.iter_mut().zip(cur.iter()) {
            // SAFETY: the cursor is inside its segment, `run` bytes from its end at most.
            *pp = unsafe { bufs[c.seg].as_ptr().add(c.off) };
        }
        // SAFETY: as above; the destination segment is writable (as_mut_ptr checks).
        let o = unsafe { bufs[d.seg].as_mut_ptr().add(d.off) };
        // SAFETY: every pointer has `run` bytes; streams are disjoint or the same.
        unsafe { xor_raw(o, &p[..srcs.len()], run) };
        d.advance(bufs, run);
        for c in cur.iter_mut() {
            c.advance(bufs, run);
        }
        left -= run;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_reactor::IoBuf;

    fn bytes(seed: usize, len: usize) -> Vec<u8> {
        (0..len).map(|i| (i.wrapping_mul(31) ^ seed.wrapping_mul(97) ^ (i >> 5)) as u8).collect()
    }

    #[test]
    fn xor_gen_is_the_bytewise_xor() {
        for n in 1..5 {
            for len in [0, 3, 64, 100, 4096, 4099] {
                let s: Vec<Vec<u8>> = (0..n).map(|k| bytes(k, len)).collect();
                let refs: Vec<&[u8]> = s.iter().map(|v| &v[..]).collect();
                let mut d = vec![0u8; len];
                xor_gen(&mut d, &refs);
                for i in 0..len {
                    assert_eq!(d[i], s.iter().fold(0, |a, v| a ^ v[i]));
                }
            }
        }
    }

    #[test]
    fn streams_cross_segments_and_xor_in_place() {
        // Three streams of 1000 bytes over segments of odd sizes.
        let data = [bytes(1, 1000), bytes(2, 1000), bytes(3, 1000)].concat();
        for cuts in [vec![3000], vec![1, 999, 1000, 1000], vec![700, 1700, 600], vec![1500, 1500]] {
            let mut bufs = IoBufs::new();
            let mut at = 0;
            for c in &cuts {
                let mut b = IoBuf::heap(*c);
                b.copy_from_slice(&data[at..at + c]);
                bufs.push(b);
                at += c;
            }
            // Stream 2 = 0 ^ 1.
            xor_streams(&mut bufs, 1000, 2, &[0, 1]);
            let flat: Vec<u8> = bufs.iter().flat_map(|b| b.to_vec()).collect();
            for i in 0..1000 {
                assert_eq!(flat[2000 + i], data[i] ^ data[1000 + i], "cuts {cuts:?} byte {i}");
            }
            // In place: stream 0 ^= 1 ^ 2 gives stream 0 ^ (0 ^ 1) ^ 1 = 0 back... of the XOR.
            xor_streams(&mut bufs, 1000, 0, &[0, 1, 2]);
            let flat: Vec<u8> = bufs.iter().flat_map(|b| b.to_vec()).collect();
            assert!(flat[..1000].iter().all(|&b| b == 0), "cuts {cuts:?}");
        }
    }
}
