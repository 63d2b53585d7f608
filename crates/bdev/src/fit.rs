//! Fitting requests to a module's limits, so that callers never have to: segments that break the
//! bdev's buffer alignment are bounced through one aligned buffer, and requests larger than the
//! module takes (size, optimal I/O boundary, segment count and size, unmap and write-zeroes
//! sizes) are split into children that point into the parent's buffers, as a fan-out
//! (`fanout`). The parent completes when its last child does, with the first failure if any.
//!
//! Costs, named: a bounce is one copy of the payload (in for writes, out for reads); a split
//! allocates one small shared state. Requests that fit take neither path.

use crate::channel::ChannelInner;
use crate::fanout::FanOut;
use crate::io::{BdevIo, IoBufs, IoRequest, IoState, IoStatus, IoType};
use smallvec::SmallVec;
use std::ops::Range;
use std::rc::Rc;

/// Copies a bounced read back into the caller's segments and gives them back.
pub(crate) fn unbounce(st: &mut IoState) {
    let Some(orig) = st.bounced.take() else { return };
    let bounce = std::mem::replace(&mut st.req.bufs, orig);
    if st.req.io_type == IoType::Read && st.status.is_ok() {
        let src = &bounce[0];
        let mut pos = 0;
        for b in st.req.bufs.iter_mut() {
            let n = b.len();
            b.copy_from_slice(&src[pos..pos + n]);
            pos += n;
        }
    }
}

/// True if a segment breaks the alignment `align`.
#[inline]
fn misaligned(bufs: &IoBufs, align: u32) -> bool {
    let mask = align as usize - 1;
    align > 1 && bufs.iter().any(|b| (b.as_ptr() as usize | b.len()) & mask != 0)
}

/// Replaces the request's segments by one aligned buffer (copying write data in). False if no
/// buffer is available now.
fn bounce(io: &mut BdevIo) -> bool {
    let len = io.req.payload_len();
    let Some(mut b) = ferrite_reactor::try_alloc_buf(len) else { return false };
    if io.req.io_type != IoType::Read {
        let mut pos = 0;
        for s in io.req.bufs.iter() {
            b[pos..pos + s.len()].copy_from_slice(s);
            pos += s.len();
        }
    }
    let orig = std::mem::replace(&mut io.req.bufs, smallvec::smallvec![b]);
    io.bounced = Some(orig);
    io.bounce_depth = io.frames.len() as u8;
    true
}

/// A child of a split: its request (without buffers) and the bytes of the parent's payload it
/// carries.
type Piece = (IoRequest, Range<usize>);

/// The children of a request under `limits`, each with the byte range of the parent's payload
/// it carries (cut by the fan-out at segment ends and at the segment size limit); None if a
/// child would have to end inside a block (the caller bounces then, which always fits).
fn plan(ch: &ChannelInner, req: &IoRequest) -> Option<SmallVec<[Piece; 4]>> {
    let l = &ch.limits;
    let bs = ch.block_size as u64;
    let mut out = SmallVec::new();
    let end = req.offset_blocks + req.num_blocks;
    let mut pos = req.offset_blocks;
    if !req.io_type.has_payload() {
        let max = match req.io_type {
            IoType::Unmap => l.max_unmap_blocks,
            _ => l.max_write_zeroes_blocks,
        };
        while pos < end {
            let mut n = end - pos;
            if max > 0 {
                n = n.min(max);
            }
            let b = l.split_boundary();
            if b > 0 {
                n = n.min(b - pos % b);
            }
            out.push((IoRequest::new(req.io_type, pos, n).with_flags(req.flags), 0..0));
            pos += n;
        }
        return Some(out);
    }
    let max_piece = l.max_segment_size as usize;
    // Segment cursor: segment index and offset inside it; `byte` is the payload offset.
    let (mut si, mut so, mut byte) = (0usize, 0usize, 0usize);
    while pos < end {
        let mut blocks = end - pos;
        if l.max_io_blocks > 0 {
            blocks = blocks.min(l.max_io_blocks as u64);
        }
        let b = l.split_boundary();
        if b > 0 {
            blocks = blocks.min(b - pos % b);
        }
        let want = (blocks * bs) as usize;
        let (mut pieces, mut got, mut last) = (0usize, 0usize, 0usize);
        while got < want {
            if l.max_segments > 0 && pieces == l.max_segments as usize {
                break;
            }
            let seg = &req.bufs[si];
            let mut take = (seg.len() - so).min(want - got);
            if max_piece > 0 {
                take = take.min(max_piece);
            }
            pieces += 1;
            last = take;
            got += take;
            so += take;
            if so == seg.len() {
                si += 1;
                so = 0;
            }
        }
        let rem = got % bs as usize;
        if rem != 0 {
            // The segment limit stopped the child inside a block: trim the last piece back.
            if last <= rem {
                return None;
            }
            got -= rem;
            if so >= rem {
                so -= rem;
            } else {
                si -= 1;
                so = req.bufs[si].len() - rem;
            }
        }
        let n = (got as u64) / bs;
        if n == 0 {
            return None;
        }
        out.push((IoRequest::new(req.io_type, pos, n).with_flags(req.flags), byte..byte + got));
        byte += got;
        pos += n;
    }
    Some(out)
}

/// True if blocks `offset..offset + n` (`n` > 0) cross a multiple of `b` (> 0). Without a
/// division when `b` is a power of two (an lvol's cluster), as it is on every request of a
/// bdev that splits at its boundary.
#[inline(always)]
pub(crate) fn crosses(offset: u64, n: u64, b: u64) -> bool {
    let last = offset + (n - 1);
    if b.is_power_of_two() {
        offset ^ last >= b
    } else {
        offset / b != last / b
    }
}

/// True if one request within the limits: no split needed.
pub(crate) fn fits(ch: &ChannelInner, req: &IoRequest) -> bool {
    let l = &ch.limits;
    // Unmaps and write-zeroes are split at the boundary too (an lvol maps each cluster alone).
    match req.io_type {
        IoType::Unmap => {
            return (l.max_unmap_blocks == 0 || req.num_blocks <= l.max_unmap_blocks) && !ch.crosses_boundary(req)
        }
        IoType::WriteZeroes => {
            return (l.max_write_zeroes_blocks == 0 || req.num_blocks <= l.max_write_zeroes_blocks)
                && !ch.crosses_boundary(req)
        }
        _ => {}
    }
    if l.max_io_blocks > 0 && req.num_blocks > l.max_io_blocks as u64 {
        return false;
    }
    if ch.crosses_boundary(req) {
        return false;
    }
    if l.max_segments > 0 && req.bufs.len() > l.max_segments as usize {
        return false;
    }
    l.max_segment_size == 0 || req.bufs.iter().all(|b| b.len() <= l.max_segment_size as usize)
}

/// Fits `io` to the channel's limits and dispatches it or its children.
pub(crate) fn fit(ch: &Rc<ChannelInner>, mut io: BdevIo) {
    let needs_bounce =
        io.req.io_type.has_payload() && io.bounced.is_none() && misaligned(&io.req.bufs, ch.limits.buf_align);
    if needs_bounce && !bounce(&mut io) {
        return ch.wait_for_memory(io);
    }
    if fits(ch, &io.req) {
        return ch.dispatch(io);
    }
    let children = match plan(ch, &io.req) {
        Some(c) => c,
        None if io.bounced.is_none() => {
            if !bounce(&mut io) {
                return ch.wait_for_memory(io);
            }
            match plan(ch, &io.req) {
                Some(c) => c,
                None => return io.complete_deferred(IoStatus::Failed(libc::EINVAL)),
            }
        }
        None => return io.complete_deferred(IoStatus::Failed(libc::EINVAL)),
    };
    io.fitted = true;
    let max_piece = ch.limits.max_segment_size as usize;
    let fan = FanOut::for_split(io);
    for (req, bytes) in children {
        let (child, _) = fan.child(ch, req, bytes, max_piece);
        ch.dispatch(child);
    }
}

#[cfg(test)]
mod tests {
    use super::crosses;

    #[test]
    fn crosses_agrees_with_division_for_every_boundary() {
        for b in 1..=40u64 {
            for offset in 0..130u64 {
                for n in 1..70u64 {
                    let want = offset / b != (offset + n - 1) / b;
                    assert_eq!(crosses(offset, n, b), want, "offset {offset} n {n} boundary {b}");
                }
            }
        }
        let big = 1u64 << 40;
        assert!(!crosses(big - 8, 8, 1 << 20));
        assert!(crosses(big - 8, 9, 1 << 20));
        assert!(crosses(u64::MAX - 9, 10, 1 << 3));
    }
}
