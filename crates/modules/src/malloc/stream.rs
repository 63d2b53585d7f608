//! Large copies within the RAM disk with non-temporal stores.
//!
//! A copy request moves whole clusters (an lvol's copy-on-write moves 4 MiB at a time) from
//! blocks nobody touched lately to blocks nobody will read soon. An ordinary copy first reads
//! each destination line into the cache to own it, then evicts it again, and evicts the
//! cache's useful lines on the way. Streaming stores write whole lines straight to memory:
//! on the AMD EPYC machine of docs/PERFORMANCE.md a cold 4 MiB copy took ~170 us instead of
//! ~245 us. Small copies, overlapping ranges and CPUs without SSE2 use `ptr::copy`.

/// Copies below this size go through `ptr::copy`: their lines are likely to be read again
/// soon, and the fence would weigh more than the saving.
const STREAM_MIN: usize = 256 * 1024;

/// Copies `len` bytes from `src` to `dst`, as `std::ptr::copy` does (the ranges may overlap),
/// streaming large non-overlapping copies past the cache. Every store is globally visible when
/// this returns.
///
/// # Safety
/// As `std::ptr::copy`: `src` valid for reads and `dst` for writes of `len` bytes.
pub(crate) unsafe fn copy(src: *const u8, dst: *mut u8, len: usize) {
    let (s, d) = (src as usize, dst as usize);
    let overlap = s < d + len && d < s + len;
    if len < STREAM_MIN || overlap {
        // SAFETY: the caller's contract.
        return unsafe { std::ptr::copy(src, dst, len) };
    }
    #[cfg(target_arch = "x86_64")]
    {
        // Head up to the destination's next 64-byte line, then whole lines, then the tail.
        let head = dst.align_offset(64).min(len);
        let body = (len - head) & !63;
        // SAFETY: the three pieces partition the caller's ranges, which do not overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(src, dst, head);
            if std::arch::is_x86_feature_detected!("avx2") {
                stream_lines_avx2(src.add(head), dst.add(head), body);
            } else {
                stream_lines_sse2(src.add(head), dst.add(head), body);
            }
            std::ptr::copy_nonoverlapping(src.add(head + body), dst.add(head + body), len - head - body);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: the caller's contract.
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, len)
    }
}

/// Streams `len` bytes (a multiple of 64) to the 64-byte aligned `dst`, 32 bytes per store,
/// then fences.
///
/// # Safety
/// AVX2 present; `src` readable and `dst` writable for `len` bytes, not overlapping.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn stream_lines_avx2(src: *const u8, dst: *mut u8, len: usize) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_stream_si256, _mm_sfence};
    debug_assert!((dst as usize).is_multiple_of(64) && len.is_multiple_of(64));
    let mut i = 0;
    while i < len {
        // SAFETY: i + 64 <= len; loads are unaligned, stores 32-byte aligned (dst is 64-aligned).
        unsafe {
            let a = _mm256_loadu_si256(src.add(i) as *const __m256i);
            let b = _mm256_loadu_si256(src.add(i + 32) as *const __m256i);
            _mm256_stream_si256(dst.add(i) as *mut __m256i, a);
            _mm256_stream_si256(dst.add(i + 32) as *mut __m256i, b);
        }
        i += 64;
    }
    // Streaming stores are weakly ordered: make them visible before the completion is.
    _mm_sfence();
}

/// As [`stream_lines_avx2`], 16 bytes per store (SSE2, which every x86_64 CPU has).
///
/// # Safety
/// `src` readable and `dst` writable for `len` bytes, not overlapping.
#[cfg(target_arch = "x86_64")]
unsafe fn stream_lines_sse2(src: *const u8, dst: *mut u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    debug_assert!((dst as usize).is_multiple_of(64) && len.is_multiple_of(64));
    let mut i = 0;
    while i < len {
        // SAFETY: i + 64 <= len; stores 16-byte aligned (dst is 64-aligned).
        unsafe {
            for k in (0..64).step_by(16) {
                let v = _mm_loadu_si128(src.add(i + k) as *const __m128i);
                _mm_stream_si128(dst.add(i + k) as *mut __m128i, v);
            }
        }
        i += 64;
    }
    // SAFETY: no preconditions.
    unsafe { _mm_sfence() };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed ^ (i >> 9) as u8)).collect()
    }

    #[test]
    fn every_size_and_misalignment_copies_exactly() {
        let mut mem = pattern(3 << 20, 7);
        for (from, to, len) in [
            (0, 1 << 20, STREAM_MIN),
            (3, (1 << 20) + 5, STREAM_MIN + 77),
            (4096, 2 << 20, 1 << 20),
            (17, (2 << 20) + 63, 1 << 19),
            (100, 200, 4096),
        ] {
            let want: Vec<u8> = mem[from..from + len].to_vec();
            let before = mem.clone();
            // SAFETY: both ranges lie within `mem`.
            unsafe { copy(mem.as_ptr().add(from), mem.as_mut_ptr().add(to), len) };
            assert!(mem[to..to + len] == want[..], "copy {from}->{to} len {len}");
            assert!(mem[..to] == before[..to] && mem[to + len..] == before[to + len..], "bytes around {to}");
        }
    }

    #[test]
    fn overlapping_ranges_move_like_memmove() {
        let mut mem = pattern(2 << 20, 3);
        let want: Vec<u8> = mem[0..STREAM_MIN * 2].to_vec();
        // SAFETY: both ranges lie within `mem`.
        unsafe { copy(mem.as_ptr(), mem.as_mut_ptr().add(4096), STREAM_MIN * 2) };
        assert!(mem[4096..4096 + STREAM_MIN * 2] == want[..]);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_sse2_path_copies_exactly_too() {
        let src = pattern(1 << 20, 9);
        let mut dst = vec![0u8; (1 << 20) + 64];
        let off = dst.as_ptr().align_offset(64);
        // SAFETY: 64-aligned destination, lengths within both buffers, no overlap.
        unsafe { stream_lines_sse2(src.as_ptr(), dst.as_mut_ptr().add(off), 1 << 20) };
        assert!(dst[off..off + (1 << 20)] == src[..]);
    }
}
