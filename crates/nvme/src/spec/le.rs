//! Little-endian fields at fixed byte offsets, and bit fields inside dwords.
//!
//! Every structure in `spec` is a fixed-size array whose field offsets are constants, so these
//! helpers index slices directly: an out-of-range offset is a bug in this module (the unit tests
//! pin every offset), never a property of the bytes being decoded.

/// `N` bytes starting at `off`.
#[inline]
pub(crate) fn arr<const N: usize>(b: &[u8], off: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[off..off + N]);
    a
}

#[inline]
pub(crate) fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes(arr(b, off))
}

#[inline]
pub(crate) fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(arr(b, off))
}

#[inline]
pub(crate) fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(arr(b, off))
}

#[inline]
pub(crate) fn u128_at(b: &[u8], off: usize) -> u128 {
    u128::from_le_bytes(arr(b, off))
}

#[inline]
pub(crate) fn put(b: &mut [u8], off: usize, v: &[u8]) {
    b[off..off + v.len()].copy_from_slice(v);
}

#[inline]
pub(crate) fn put_u16(b: &mut [u8], off: usize, v: u16) {
    put(b, off, &v.to_le_bytes());
}

#[inline]
pub(crate) fn put_u32(b: &mut [u8], off: usize, v: u32) {
    put(b, off, &v.to_le_bytes());
}

#[inline]
pub(crate) fn put_u64(b: &mut [u8], off: usize, v: u64) {
    put(b, off, &v.to_le_bytes());
}

#[inline]
pub(crate) fn put_u128(b: &mut [u8], off: usize, v: u128) {
    put(b, off, &v.to_le_bytes());
}

/// Bits `shift..shift + width` of `v` (`width` < 32).
#[inline]
pub(crate) const fn bits(v: u32, shift: u32, width: u32) -> u32 {
    (v >> shift) & ((1 << width) - 1)
}

/// Bit `n` of `v`.
#[inline]
pub(crate) const fn bit(v: u32, n: u32) -> bool {
    v & (1 << n) != 0
}

/// `v` masked to `width` bits and moved to `shift` (`width` < 32).
#[inline]
pub(crate) const fn place(v: u32, shift: u32, width: u32) -> u32 {
    (v & ((1 << width) - 1)) << shift
}

/// `1 << n` when `b`, else 0.
#[inline]
pub(crate) const fn flag(b: bool, n: u32) -> u32 {
    (b as u32) << n
}

/// Copies `s` into `out`, truncated to its length, and fills the rest with `pad`.
pub(crate) fn pad_field(out: &mut [u8], s: &[u8], pad: u8) {
    let n = s.len().min(out.len());
    out[..n].copy_from_slice(&s[..n]);
    out[n..].fill(pad);
}

/// The bytes of a fixed text field up to its first NUL, with trailing spaces and NULs removed
/// (identify strings are space padded, NQNs and discovery addresses NUL padded).
pub(crate) fn trim_field(b: &[u8]) -> &[u8] {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    let mut s = &b[..end];
    while let [rest @ .., b' '] = s {
        s = rest;
    }
    s
}
