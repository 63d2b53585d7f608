//! Fitting requests to a module's limits, so that callers never have to: segments that break the
//! bdev's buffer rules (address alignment, length multiple) are bounced through aligned pool
//! buffers, only those segments; writes of a bdev with a write unit are checked against it; and
//! requests larger than the module takes (size, optimal I/O boundary or write unit, segment
//! count and size, unmap, write-zeroes and copy sizes) are split into children that point into
//! the parent's buffers, as a fan-out (`fanout`). The parent completes when its last child does,
//! with the first failure if any.
//!
//! Costs, named: a bounce is one copy of the bounced segments (in for writes, out for reads)
//! and one pool buffer per run of them; a split allocates one small shared state. Requests that
//! fit take neither path.

use crate::channel::ChannelInner;
use crate::fanout::FanOut;
use crate::io::{BdevIo, IoAux, IoBufs, IoRequest, IoState, IoStatus, IoType};
use crate::Limits;
use ferrite_reactor::IoBuf;
use smallvec::SmallVec;
use std::ops::Range;
use std::ptr::NonNull;
use std::rc::Rc;

/// Copies the bounced segments of a read back into the caller's and gives the caller's
/// segments back. A segment that was kept (a view of the caller's own) needs no copy: it is the
/// caller's memory.
pub(crate) fn unbounce(st: &mut IoState) {
    let Some(orig) = st.bounced.take() else { return };
    let used = std::mem::replace(&mut st.req.bufs, orig);
    if st.req.io_type != IoType::Read {
        return;
    }
    let ok = st.status.is_ok();
    // Walk both lists by payload offset: each used segment is either a view of the caller's
    // segment starting at the same offset, or a pool buffer covering one or more of them.
    let (mut oi, mut opos) = (0usize, 0usize);
    let mut pos = 0usize;
    for u in used.iter() {
        if u.is_empty() {
            continue;
        }
        while opos + st.req.bufs[oi].len() <= pos {
            opos += st.req.bufs[oi].len();
            oi += 1;
        }
        let kept = opos == pos && u.as_ptr() == st.req.bufs[oi].as_ptr();
        if kept && !st.req.bufs[oi].is_read_only() {
            // The module wrote the caller's memory through a view: the segment no longer
            // counts as known zeroes (`IoBuf::zero` would skip it).
            let _ = st.req.bufs[oi].as_mut_ptr();
        } else if ok {
            copy_out(u, &mut st.req.bufs, pos);
        }
        pos += u.len();
    }
}

/// Copies `src` into `dst`'s bytes from payload offset `at` on.
fn copy_out(src: &[u8], dst: &mut IoBufs, at: usize) {
    let (mut start, mut done) = (0usize, 0usize);
    for d in dst.iter_mut() {
        let end = start + d.len();
        if end > at + done && done < src.len() {
            let off = at + done - start;
            let n = (d.len() - off).min(src.len() - done);
            d[off..off + n].copy_from_slice(&src[done..done + n]);
            done += n;
        }
        start = end;
        if done == src.len() {
            break;
        }
    }
    debug_assert_eq!(done, src.len(), "a bounce buffer lies within the caller's payload");
}

/// True if a segment breaks the address or length rule of masks `(amask, lmask)`.
#[inline(always)]
fn bad(b: &IoBuf, (amask, lmask): (usize, usize)) -> bool {
    (b.as_ptr() as usize & amask) | (b.len() & lmask) != 0
}

/// True if a segment breaks the bdev's buffer rules (the channel's `seg_masks`). On the path
/// of every read and write that is fitted: one AND per segment more than a single rule for
/// address and length took (callgrind, -O3: 20 instructions against 19 for one segment, 31
/// against 28 for two), the masks precomputed.
#[inline]
fn misaligned(bufs: &IoBufs, (amask, lmask): (usize, usize)) -> bool {
    amask | lmask != 0 && bufs.iter().any(|b| bad(b, (amask, lmask)))
}

/// Replaces the segments that break the buffer rules by aligned pool buffers (copying write
/// data in), keeping the others as views of the caller's: a run of bad segments goes into one
/// buffer, closed once its length is a multiple of the length rule. With `whole`, the whole
/// payload goes into one buffer (a split that cannot cut the segments as they are). False if
/// no buffer is available now (nothing changed then).
fn bounce(io: &mut BdevIo, m: (usize, usize), whole: bool) -> bool {
    let write = io.req.io_type != IoType::Read;
    let segs = &io.req.bufs;
    let mut out = IoBufs::new();
    let mut i = 0;
    while i < segs.len() {
        if !whole && (segs[i].is_empty() || !bad(&segs[i], m)) {
            // SAFETY: the view points into a segment of the caller's that the request keeps in
            // `bounced` until `unbounce` drops the views first; a read's view is writable only
            // where the segment is.
            out.push(unsafe { view_of(&segs[i]) });
            i += 1;
            continue;
        }
        let start = i;
        let mut len = 0usize;
        while i < segs.len() {
            len += segs[i].len();
            i += 1;
            if !whole && len & m.1 == 0 {
                break;
            }
        }
        let Some(mut b) = ferrite_reactor::try_alloc_buf(len) else { return false };
        debug_assert!(!bad(&b, m), "pool buffers meet every alignment a bdev may declare");
        if write {
            let mut pos = 0;
            for s in &segs[start..i] {
                b[pos..pos + s.len()].copy_from_slice(s);
                pos += s.len();
            }
        }
        out.push(b);
    }
    let orig = std::mem::replace(&mut io.req.bufs, out);
    io.bounced = Some(orig);
    io.bounce_depth = io.frames.len() as u8;
    true
}

/// A view of all of `seg`.
///
/// # Safety
/// `seg` must outlive the view.
unsafe fn view_of(seg: &IoBuf) -> IoBuf {
    // SAFETY: the caller keeps `seg` alive; the pointer comes from a live buffer.
    unsafe { IoBuf::view(NonNull::new_unchecked(seg.as_ptr() as *mut u8), seg.len(), !seg.is_read_only()) }
}

/// True if the views a fan-out child makes of bytes `range` (`fanout::slice`: cut at segment
/// ends and every `max_segment_size` bytes) meet the buffer rules `m`. A split cuts segments
/// where the block count says, so a segment that was fine whole may not be at a cut.
fn pieces_ok(bufs: &IoBufs, range: &Range<usize>, l: &Limits, m: (usize, usize)) -> bool {
    let max_piece = l.max_segment_size as usize;
    let mut seg_start = 0usize;
    let mut pos = range.start;
    for seg in bufs.iter() {
        let seg_end = seg_start + seg.len();
        while pos < range.end && pos < seg_end {
            let mut take = range.end.min(seg_end) - pos;
            if max_piece > 0 {
                take = take.min(max_piece);
            }
            let addr = seg.as_ptr() as usize + (pos - seg_start);
            if (addr & m.0) | (take & m.1) != 0 {
                return false;
            }
            pos += take;
        }
        seg_start = seg_end;
        if pos >= range.end {
            break;
        }
    }
    true
}

/// True if one pool buffer already stands in for the whole payload.
fn bounced_whole(io: &BdevIo) -> bool {
    match &io.bounced {
        Some(orig) => io.req.bufs.len() == 1 && orig.first().is_none_or(|o| o.as_ptr() != io.req.bufs[0].as_ptr()),
        None => false,
    }
}

/// Gives the caller's segments back before bouncing the whole payload instead (no data
/// moved: nothing reached the module yet).
fn undo_bounce(io: &mut BdevIo) {
    if let Some(orig) = io.bounced.take() {
        io.req.bufs = orig;
    }
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
        let (max, b) = match req.io_type {
            IoType::Unmap => (l.max_unmap_request(), l.split_boundary()),
            // SPDK splits copies at `max_copy` only.
            IoType::Copy => (l.max_copy_blocks, 0),
            _ => (l.max_write_zeroes_blocks, l.split_boundary()),
        };
        while pos < end {
            let mut n = end - pos;
            if max > 0 {
                n = n.min(max);
            }
            if b > 0 {
                n = n.min(b - pos % b);
            }
            let mut child = IoRequest::new(req.io_type, pos, n).with_flags(req.flags);
            if let IoAux::CopyFrom(src) = req.aux {
                child.aux = IoAux::CopyFrom(src + (pos - req.offset_blocks));
            }
            out.push((child, 0..0));
            pos += n;
        }
        return Some(out);
    }
    let max_piece = l.max_segment_size as usize;
    // Writes of a bdev with a write unit: one child per unit, which replaces the boundary.
    let unit = if req.io_type == IoType::Write { l.write_unit() } else { 0 };
    let b = if unit > 0 { unit } else { l.split_boundary() };
    // A child ends on a whole block, or a whole unit.
    let grain = (unit.max(1) * bs) as usize;
    // Segment cursor: segment index and offset inside it; `byte` is the payload offset.
    let (mut si, mut so, mut byte) = (0usize, 0usize, 0usize);
    while pos < end {
        let mut blocks = end - pos;
        if l.max_io_blocks > 0 {
            blocks = blocks.min(l.max_io_blocks as u64);
        }
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
        let rem = got % grain;
        if rem != 0 {
            // The segment limit stopped the child inside a block (or unit): trim the last
            // piece back.
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
            let max = l.max_unmap_request();
            return (max == 0 || req.num_blocks <= max) && !ch.crosses_boundary(req);
        }
        IoType::WriteZeroes => {
            return (l.max_write_zeroes_blocks == 0 || req.num_blocks <= l.max_write_zeroes_blocks)
                && !ch.crosses_boundary(req)
        }
        IoType::Copy => return l.max_copy_blocks == 0 || req.num_blocks <= l.max_copy_blocks,
        _ => {}
    }
    if l.max_io_blocks > 0 && req.num_blocks > l.max_io_blocks as u64 {
        return false;
    }
    if l.split_on_write_unit && req.io_type == IoType::Write {
        // Exactly one unit, aligned, fits (the unit replaces the boundary); `fit` refuses the
        // writes that are not whole units and splits the others.
        let unit = l.write_unit();
        if req.num_blocks != unit || !req.offset_blocks.is_multiple_of(unit) {
            return false;
        }
    } else if ch.crosses_boundary(req) {
        return false;
    }
    if l.max_segments > 0 && req.bufs.len() > l.max_segments as usize {
        return false;
    }
    l.max_segment_size == 0 || req.bufs.iter().all(|b| b.len() <= l.max_segment_size as usize)
}

/// True if a write breaks the bdev's write unit: its offset or length is not a whole number of
/// units.
#[inline]
fn breaks_write_unit(l: &Limits, req: &IoRequest) -> bool {
    let unit = l.write_unit();
    unit > 1
        && req.io_type == IoType::Write
        && (!req.offset_blocks.is_multiple_of(unit) || !req.num_blocks.is_multiple_of(unit))
}

/// Fits `io` to the channel's limits and dispatches it or its children.
pub(crate) fn fit(ch: &Rc<ChannelInner>, mut io: BdevIo) {
    let l = &ch.limits;
    let m = ch.seg_masks;
    let needs_bounce = io.req.io_type.has_payload() && io.bounced.is_none() && misaligned(&io.req.bufs, m);
    if needs_bounce && !bounce(&mut io, m, false) {
        return ch.wait_for_memory(io);
    }
    if fits(ch, &io.req) {
        return ch.dispatch(io);
    }
    // Checked here, off the path of requests that fit: `fits` takes a write of a bdev with a
    // write unit only when it is exactly one unit, aligned.
    if l.split_on_write_unit && breaks_write_unit(l, &io.req) {
        undo_bounce(&mut io);
        return io.complete_deferred(IoStatus::Misaligned);
    }
    let cuttable = |req: &IoRequest, c: &[Piece]| m == (0, 0) || c.iter().all(|(_, r)| pieces_ok(&req.bufs, r, l, m));
    let children = match plan(ch, &io.req) {
        // Children cut inside a segment must still meet the buffer rules at their cuts.
        Some(c) if cuttable(&io.req, &c) => c,
        // The segments cannot be cut as the limits ask: one buffer for the whole payload
        // always can (the caller's, or those a per-segment bounce left).
        _ if bounced_whole(&io) => return io.complete_deferred(IoStatus::Failed(libc::EINVAL)),
        _ => {
            undo_bounce(&mut io);
            if !bounce(&mut io, m, true) {
                return ch.wait_for_memory(io);
            }
            match plan(ch, &io.req) {
                Some(c) => c,
                None => return io.complete_deferred(IoStatus::Failed(libc::EINVAL)),
            }
        }
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
