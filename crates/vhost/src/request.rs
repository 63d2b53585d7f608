//! Splitting a descriptor chain into a virtio-blk request: the 16-byte header at the start of
//! the device-readable part, the status byte at the end of the device-writable part, and the
//! data in between, as guest-physical segments. The driver may frame these as it likes (VIRTIO
//! 1.2, 2.6.4: a header may span descriptors, data may share one with the header or status);
//! what the device may not assume, this does not assume.
//!
//! Pure: the walk of the ring gives the descriptors, `read` gives the header's bytes, and the
//! result names guest memory without touching it. A chain the driver built wrong gives an
//! error, with the status byte's address when there is one to report IOERR into.

use crate::blk::{Header, HEADER_LEN};
use smallvec::SmallVec;

/// One descriptor of a chain: a guest-physical buffer and who writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Desc {
    /// Guest-physical address.
    pub addr: u64,
    /// Bytes.
    pub len: u32,
    /// Device-writable (the driver reads it back).
    pub write: bool,
}

/// A guest-physical buffer of the request's data.
pub type Seg = (u64, u32);

/// Data segments a request keeps inline (more spill to the heap: rare, large requests).
pub const INLINE_SEGS: usize = 8;

/// A request as the chain lays it out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// What to do, where.
    pub header: Header,
    /// The data: device-readable bytes after the header for writes, discards and write zeroes;
    /// device-writable bytes before the status for reads and GET_ID.
    pub data: SmallVec<[Seg; INLINE_SEGS]>,
    /// Total bytes of `data`.
    pub data_len: u64,
    /// Guest-physical address of the status byte.
    pub status: u64,
}

/// What is wrong with a chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainError {
    /// No device-writable byte at the end: there is nowhere to put a status. The request can
    /// only be returned unanswered.
    NoStatus,
    /// Fewer than 16 device-readable bytes: no header. IOERR into `status`.
    ShortHeader {
        /// The status byte's address.
        status: u64,
    },
    /// A device-readable descriptor after a device-writable one. IOERR into `status`.
    Order {
        /// The status byte's address.
        status: u64,
    },
    /// More data segments than the device takes (`seg_max`). IOERR into `status`.
    TooManySegments {
        /// The status byte's address.
        status: u64,
    },
    /// The header's bytes could not be read (not in guest memory). IOERR into `status`.
    Unreadable {
        /// The status byte's address.
        status: u64,
    },
}

impl ChainError {
    /// Where to report IOERR, if anywhere.
    pub fn status(self) -> Option<u64> {
        match self {
            ChainError::NoStatus => None,
            ChainError::ShortHeader { status }
            | ChainError::Order { status }
            | ChainError::TooManySegments { status }
            | ChainError::Unreadable { status } => Some(status),
        }
    }
}

/// Why a descriptor chain could not be walked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WalkError {
    /// A descriptor (or indirect table) is not in guest memory.
    Unreadable,
    /// A `next` index past the table.
    BadIndex,
    /// More descriptors than the table has: a loop.
    TooLong,
    /// An indirect descriptor inside an indirect table, or a table whose length is not a
    /// multiple of 16 or is empty.
    BadIndirect,
}

const F_NEXT: u16 = 1;
const F_WRITE: u16 = 2;
const F_INDIRECT: u16 = 4;

/// How a walk ended well.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Walked {
    /// Every descriptor is in `out`.
    Whole,
    /// More than the caller takes: `out` holds the first ones and the last (which holds the
    /// status byte, so that the request can be failed rather than left unanswered).
    Overlong,
}

/// Walks the chain starting at descriptor `head` of the table at `table` (`size` entries),
/// following `next` links and one level of indirect table, into `out` (cleared first). At most
/// `max` descriptors are kept (see [`Walked::Overlong`]); a chain may not visit more
/// descriptors than its table has (which stops loops). `read(addr)` reads the 16 bytes of a
/// descriptor at a guest-physical address.
pub fn walk_chain(
    mut read: impl FnMut(u64) -> Option<[u8; 16]>,
    table: u64,
    size: u16,
    head: u16,
    max: usize,
    out: &mut Vec<Desc>,
) -> Result<Walked, WalkError> {
    out.clear();
    let mut walked = Walked::Whole;
    let (mut table, mut size, mut index) = (table, size as u32, head as u32);
    let mut ttl = size;
    let mut indirect = false;
    loop {
        if index >= size {
            return Err(WalkError::BadIndex);
        }
        if ttl == 0 {
            return Err(WalkError::TooLong);
        }
        ttl -= 1;
        let at = table.checked_add(index as u64 * 16).ok_or(WalkError::Unreadable)?;
        let raw = read(at).ok_or(WalkError::Unreadable)?;
        let addr = u64::from_le_bytes(raw[0..8].try_into().unwrap());
        let len = u32::from_le_bytes(raw[8..12].try_into().unwrap());
        let flags = u16::from_le_bytes(raw[12..14].try_into().unwrap());
        let next = u16::from_le_bytes(raw[14..16].try_into().unwrap());
        if flags & F_INDIRECT != 0 {
            // VIRTIO 1.2 2.7.5.3.1: no indirect inside indirect, and an indirect descriptor
            // stands alone (no NEXT).
            if indirect || flags & F_NEXT != 0 || len == 0 || !len.is_multiple_of(16) || len / 16 > u16::MAX as u32 {
                return Err(WalkError::BadIndirect);
            }
            indirect = true;
            table = addr;
            size = len / 16;
            ttl = size;
            index = 0;
            continue;
        }
        let d = Desc { addr, len, write: flags & F_WRITE != 0 };
        if out.len() < max {
            out.push(d);
        } else {
            // Past the bound: keep walking (the table's size bounds it) for the last one.
            walked = Walked::Overlong;
            match out.last_mut() {
                Some(last) => *last = d,
                None => out.push(d),
            }
        }
        if flags & F_NEXT == 0 {
            return Ok(walked);
        }
        index = next as u32;
    }
}

/// Keeps `d` in `out`, at most `max` of them: past the bound the last one kept is replaced (it
/// holds the status byte). True once past the bound.
fn keep_bounded(out: &mut Vec<Desc>, max: usize, d: Desc) -> bool {
    if out.len() < max {
        out.push(d);
        return false;
    }
    match out.last_mut() {
        Some(last) => *last = d,
        None => out.push(d),
    }
    true
}

/// Walks a packed ring's chain (VIRTIO 1.2, 2.8.6 and 2.8.7) into `out` (cleared first): the
/// `count` descriptors the ring holds for it, in ring order, `ring(i)` giving the i-th one's 16
/// bytes in the packed format (u64 addr, u32 len, u16 id, u16 flags), or the indirect table its
/// one descriptor names, whose descriptors `read(addr)` reads from guest memory. In a table
/// only the WRITE flag counts (the others and the buffer id are reserved); an indirect
/// descriptor must stand alone (a list holds descriptors of one type); no table inside a table.
/// At most `max` descriptors are kept, as [`walk_chain`] does ([`Walked::Overlong`]).
pub fn walk_packed(
    mut ring: impl FnMut(u16) -> [u8; 16],
    count: u16,
    mut read: impl FnMut(u64) -> Option<[u8; 16]>,
    max: usize,
    out: &mut Vec<Desc>,
) -> Result<Walked, WalkError> {
    out.clear();
    let mut over = false;
    let fields = |raw: &[u8; 16]| {
        let addr = u64::from_le_bytes(raw[0..8].try_into().unwrap());
        let len = u32::from_le_bytes(raw[8..12].try_into().unwrap());
        let flags = u16::from_le_bytes(raw[14..16].try_into().unwrap());
        (addr, len, flags)
    };
    for i in 0..count {
        let (addr, len, flags) = fields(&ring(i));
        if flags & F_INDIRECT != 0 {
            if count != 1 || flags & F_NEXT != 0 || len == 0 || !len.is_multiple_of(16) || len / 16 > u16::MAX as u32 {
                return Err(WalkError::BadIndirect);
            }
            for j in 0..(len / 16) as u64 {
                let at = addr.checked_add(16 * j).ok_or(WalkError::Unreadable)?;
                let (a, l, f) = fields(&read(at).ok_or(WalkError::Unreadable)?);
                over |= keep_bounded(out, max, Desc { addr: a, len: l, write: f & F_WRITE != 0 });
            }
            break;
        }
        over |= keep_bounded(out, max, Desc { addr, len, write: flags & F_WRITE != 0 });
    }
    Ok(if over { Walked::Overlong } else { Walked::Whole })
}

/// Lays out the request of `chain` (the chain's descriptors in order). `read(addr, buf)`
/// reads guest memory (false: not guest memory); `seg_max` bounds the data segments.
pub fn layout(
    chain: &[Desc],
    seg_max: usize,
    mut read: impl FnMut(u64, &mut [u8]) -> bool,
) -> Result<Layout, ChainError> {
    // The status: the last byte of the last descriptor, which must be device-writable.
    let status = match chain.iter().rposition(|d| d.len > 0) {
        Some(i) if chain[i].write => chain[i].addr.checked_add(chain[i].len as u64 - 1).ok_or(ChainError::NoStatus)?,
        _ => return Err(ChainError::NoStatus),
    };
    let readable = chain.iter().take_while(|d| !d.write).count();
    if chain[readable..].iter().any(|d| !d.write) {
        return Err(ChainError::Order { status });
    }
    // The header: the first 16 readable bytes, however they are split.
    let mut hdr = [0u8; HEADER_LEN];
    let mut got = 0usize;
    // (descriptor index, bytes of it the header took) where the data starts.
    let mut after = (0usize, 0u32);
    for (i, d) in chain[..readable].iter().enumerate() {
        if got == HEADER_LEN {
            break;
        }
        let take = (HEADER_LEN - got).min(d.len as usize);
        if take > 0 && !read(d.addr, &mut hdr[got..got + take]) {
            return Err(ChainError::Unreadable { status });
        }
        got += take;
        after = (i, take as u32);
        if take == d.len as usize {
            after = (i + 1, 0);
        }
    }
    if got < HEADER_LEN {
        return Err(ChainError::ShortHeader { status });
    }
    let header = Header::decode(&hdr);
    let mut out = Layout { header, data: SmallVec::new(), data_len: 0, status };
    let mut push = |addr: u64, len: u32| -> Result<(), ChainError> {
        if len == 0 {
            return Ok(());
        }
        if out.data.len() == seg_max {
            return Err(ChainError::TooManySegments { status });
        }
        out.data.push((addr, len));
        out.data_len += len as u64;
        Ok(())
    };
    if header.kind == crate::blk::T_IN || header.kind == crate::blk::T_GET_ID {
        // Writable bytes, less the status byte at the end.
        let w = &chain[readable..];
        let last = w.iter().rposition(|d| d.len > 0).expect("the status descriptor is writable");
        for (i, d) in w.iter().enumerate().take(last + 1) {
            let len = if i == last { d.len - 1 } else { d.len };
            push(d.addr, len)?;
        }
    } else {
        let (first, skip) = after;
        for (i, d) in chain[..readable].iter().enumerate().skip(first) {
            let skip = if i == first { skip } else { 0 };
            push(d.addr + skip as u64, d.len - skip)?;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blk::{T_IN, T_OUT};
    use proptest::prelude::*;

    fn header(kind: u32, sector: u64) -> [u8; 16] {
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&kind.to_le_bytes());
        h[8..16].copy_from_slice(&sector.to_le_bytes());
        h
    }

    /// Guest memory: 64 KiB with a header at 0.
    fn mem(kind: u32, sector: u64) -> Vec<u8> {
        let mut m = vec![0u8; 65536];
        m[..16].copy_from_slice(&header(kind, sector));
        m
    }

    fn reader(m: &[u8]) -> impl FnMut(u64, &mut [u8]) -> bool + '_ {
        move |a, b| {
            let a = a as usize;
            match m.get(a..a + b.len()) {
                Some(s) => {
                    b.copy_from_slice(s);
                    true
                }
                None => false,
            }
        }
    }

    fn d(addr: u64, len: u32, write: bool) -> Desc {
        Desc { addr, len, write }
    }

    #[test]
    fn linux_framing_header_data_status() {
        let m = mem(T_IN, 8);
        let l = layout(&[d(0, 16, false), d(4096, 4096, true), d(100, 1, true)], 126, reader(&m)).unwrap();
        assert_eq!(l.header, Header { kind: T_IN, sector: 8 });
        assert_eq!(l.data.as_slice(), &[(4096, 4096)]);
        assert_eq!((l.data_len, l.status), (4096, 100));
        let m = mem(T_OUT, 0);
        let l = layout(&[d(0, 16, false), d(4096, 512, false), d(8192, 512, false), d(100, 1, true)], 126, reader(&m))
            .unwrap();
        assert_eq!(l.data.as_slice(), &[(4096, 512), (8192, 512)]);
        assert_eq!(l.status, 100);
    }

    #[test]
    fn any_framing_header_split_data_shared_with_header_and_status() {
        // Header split 10 + 6 with 506 data bytes behind it in the second descriptor.
        let mut m = vec![0u8; 65536];
        let h = header(T_OUT, 3);
        m[..10].copy_from_slice(&h[..10]);
        m[1000..1006].copy_from_slice(&h[10..]);
        let l = layout(&[d(0, 10, false), d(1000, 512, false), d(5000, 1, true)], 126, reader(&m)).unwrap();
        assert_eq!(l.header, Header { kind: T_OUT, sector: 3 });
        assert_eq!(l.data.as_slice(), &[(1006, 506)]);
        // A read whose last writable descriptor holds data and the status.
        let m = mem(T_IN, 0);
        let l = layout(&[d(0, 16, false), d(4096, 513, true)], 126, reader(&m)).unwrap();
        assert_eq!(l.data.as_slice(), &[(4096, 512)]);
        assert_eq!(l.status, 4096 + 512);
    }

    #[test]
    fn malformed_chains_are_named_with_their_status_byte_when_there_is_one() {
        let m = mem(T_OUT, 0);
        assert_eq!(layout(&[d(0, 16, false)], 126, reader(&m)), Err(ChainError::NoStatus));
        assert_eq!(layout(&[], 126, reader(&m)), Err(ChainError::NoStatus));
        assert_eq!(layout(&[d(0, 16, false), d(9, 0, true)], 126, reader(&m)), Err(ChainError::NoStatus));
        assert_eq!(
            layout(&[d(0, 8, false), d(50, 1, true)], 126, reader(&m)),
            Err(ChainError::ShortHeader { status: 50 })
        );
        assert_eq!(
            layout(&[d(0, 16, false), d(60, 8, true), d(70, 8, false), d(50, 1, true)], 126, reader(&m)),
            Err(ChainError::Order { status: 50 })
        );
        assert_eq!(
            layout(&[d(1 << 40, 16, false), d(50, 1, true)], 126, reader(&m)),
            Err(ChainError::Unreadable { status: 50 })
        );
        let mut many = vec![d(0, 16, false)];
        many.extend((0..4).map(|i| d(4096 * (i + 1), 512, false)));
        many.push(d(50, 1, true));
        assert_eq!(layout(&many, 3, reader(&m)), Err(ChainError::TooManySegments { status: 50 }));
        assert!(layout(&many, 4, reader(&m)).is_ok());
        assert_eq!(
            layout(&[d(0, 16, false), d(u64::MAX, 1, true)], 126, reader(&m)).map(|l| l.status),
            Ok(u64::MAX),
            "the last byte of the address space is a place like any other; memory says if it is there"
        );
    }

    /// A descriptor table in a byte array (16 bytes each: addr, len, flags, next).
    fn table(descs: &[(u64, u32, u16, u16)]) -> Vec<u8> {
        let mut t = Vec::new();
        for &(a, l, f, n) in descs {
            t.extend_from_slice(&a.to_le_bytes());
            t.extend_from_slice(&l.to_le_bytes());
            t.extend_from_slice(&f.to_le_bytes());
            t.extend_from_slice(&n.to_le_bytes());
        }
        t
    }

    fn read16(m: &[u8]) -> impl FnMut(u64) -> Option<[u8; 16]> + '_ {
        move |a| m.get(a as usize..a as usize + 16).map(|s| s.try_into().unwrap())
    }

    #[test]
    fn walks_direct_and_indirect_chains_and_stops_loops_and_bad_links() {
        // 0 -> 2 -> 1 (end); 3 is indirect to a table at 0x100 of two descriptors.
        let mut m = table(&[
            (1000, 16, F_NEXT, 2),
            (3000, 1, F_WRITE, 0),
            (2000, 512, F_NEXT | F_WRITE, 1),
            (0x100, 32, F_INDIRECT, 0),
        ]);
        m.resize(0x100, 0);
        m.extend(table(&[(4000, 16, F_NEXT, 1), (5000, 1, F_WRITE, 0)]));
        let mut out = Vec::new();
        assert_eq!(walk_chain(read16(&m), 0, 4, 0, 16, &mut out), Ok(Walked::Whole));
        assert_eq!(out, vec![d(1000, 16, false), d(2000, 512, true), d(3000, 1, true)]);
        assert_eq!(walk_chain(read16(&m), 0, 4, 3, 16, &mut out), Ok(Walked::Whole));
        assert_eq!(out, vec![d(4000, 16, false), d(5000, 1, true)]);
        assert_eq!(walk_chain(read16(&m), 0, 4, 0, 2, &mut out), Ok(Walked::Overlong), "more than the caller takes");
        assert_eq!(out, vec![d(1000, 16, false), d(3000, 1, true)], "the first, and the last in place of the rest");
        assert_eq!(walk_chain(read16(&m), 0, 4, 4, 16, &mut out), Err(WalkError::BadIndex), "head past the table");
        let looped = table(&[(1000, 16, F_NEXT, 1), (2000, 16, F_NEXT, 0)]);
        assert_eq!(walk_chain(read16(&looped), 0, 2, 0, 100, &mut out), Err(WalkError::TooLong), "a loop");
        let bad_next = table(&[(1000, 16, F_NEXT, 7)]);
        assert_eq!(walk_chain(read16(&bad_next), 0, 1, 0, 100, &mut out), Err(WalkError::BadIndex));
        let nested = table(&[(0, 16, F_INDIRECT, 0)]);
        assert_eq!(
            walk_chain(read16(&nested), 0, 1, 0, 100, &mut out),
            Err(WalkError::BadIndirect),
            "indirect inside indirect"
        );
        let odd = table(&[(0x100, 20, F_INDIRECT, 0)]);
        assert_eq!(
            walk_chain(read16(&odd), 0, 1, 0, 100, &mut out),
            Err(WalkError::BadIndirect),
            "table length not a multiple of 16"
        );
        let outside = table(&[(1 << 40, 32, F_INDIRECT, 0)]);
        assert_eq!(walk_chain(read16(&outside), 0, 1, 0, 100, &mut out), Err(WalkError::Unreadable));
    }

    /// Packed descriptors (16 bytes each: addr, len, id, flags).
    fn packed(descs: &[(u64, u32, u16, u16)]) -> Vec<[u8; 16]> {
        descs
            .iter()
            .map(|&(a, l, id, f)| {
                let mut d = [0u8; 16];
                d[0..8].copy_from_slice(&a.to_le_bytes());
                d[8..12].copy_from_slice(&l.to_le_bytes());
                d[12..14].copy_from_slice(&id.to_le_bytes());
                d[14..16].copy_from_slice(&f.to_le_bytes());
                d
            })
            .collect()
    }

    #[test]
    fn walks_packed_chains_and_indirect_tables_and_refuses_mixed_ones() {
        let ring = packed(&[(1000, 16, 0, F_NEXT), (2000, 512, 0, F_NEXT | F_WRITE), (3000, 1, 5, F_WRITE)]);
        let none = |_: u64| None;
        let mut out = Vec::new();
        assert_eq!(walk_packed(|i| ring[i as usize], 3, none, 16, &mut out), Ok(Walked::Whole));
        assert_eq!(out, vec![d(1000, 16, false), d(2000, 512, true), d(3000, 1, true)]);
        assert_eq!(walk_packed(|i| ring[i as usize], 3, none, 2, &mut out), Ok(Walked::Overlong));
        assert_eq!(out, vec![d(1000, 16, false), d(3000, 1, true)], "the first, and the last in place of the rest");
        // An indirect table at 0x100: only WRITE counts there (NEXT, INDIRECT and ids ignored).
        let mut m = vec![0u8; 0x100];
        for t in packed(&[(4000, 16, 9, F_NEXT | F_INDIRECT), (5000, 1, 9, F_WRITE)]) {
            m.extend_from_slice(&t);
        }
        let ind = packed(&[(0x100, 32, 3, F_INDIRECT | F_WRITE)]);
        assert_eq!(walk_packed(|i| ind[i as usize], 1, read16(&m), 16, &mut out), Ok(Walked::Whole));
        assert_eq!(out, vec![d(4000, 16, false), d(5000, 1, true)]);
        let odd = packed(&[(0x100, 24, 3, F_INDIRECT)]);
        assert_eq!(walk_packed(|i| odd[i as usize], 1, read16(&m), 16, &mut out), Err(WalkError::BadIndirect));
        let empty = packed(&[(0x100, 0, 3, F_INDIRECT)]);
        assert_eq!(walk_packed(|i| empty[i as usize], 1, read16(&m), 16, &mut out), Err(WalkError::BadIndirect));
        let mixed = packed(&[(1000, 16, 0, F_NEXT), (0x100, 32, 3, F_INDIRECT)]);
        assert_eq!(
            walk_packed(|i| mixed[i as usize], 2, read16(&m), 16, &mut out),
            Err(WalkError::BadIndirect),
            "a list holds descriptors of one type"
        );
        let outside = packed(&[(1 << 40, 32, 3, F_INDIRECT)]);
        assert_eq!(walk_packed(|i| outside[i as usize], 1, read16(&m), 16, &mut out), Err(WalkError::Unreadable));
        let wraps = packed(&[(u64::MAX - 8, 32, 3, F_INDIRECT)]);
        assert_eq!(walk_packed(|i| wraps[i as usize], 1, |_| Some([0; 16]), 16, &mut out), Err(WalkError::Unreadable));
    }

    proptest! {
        /// Any packed ring bytes, any count, any indirect table: the walk ends and never keeps
        /// more than asked.
        #[test]
        fn any_packed_walk_terminates_within_bounds(bytes in proptest::collection::vec(any::<u8>(), 16..512), count in 1u16..40, max in 1usize..20) {
            let mut out = Vec::new();
            let ring = |i: u16| {
                let at = (16 * i as usize) % (bytes.len() - 15);
                bytes[at..at + 16].try_into().unwrap()
            };
            let _ = walk_packed(ring, count, read16(&bytes), max, &mut out);
            prop_assert!(out.len() <= max);
        }
    }

    proptest! {
        /// Any table, any head: the walk ends, within the table's size plus one indirect
        /// table's, and never yields more than asked.
        #[test]
        fn any_table_walk_terminates_within_bounds(bytes in proptest::collection::vec(any::<u8>(), 0..512), size in 1u16..40, head in 0u16..45) {
            let mut out = Vec::new();
            let _ = walk_chain(read16(&bytes), 0, size, head, 64, &mut out);
            prop_assert!(out.len() <= 64);
        }
    }

    proptest! {
        /// However a request's bytes are cut into descriptors, the layout finds the same
        /// header, the same data bytes in order, and the same status byte.
        #[test]
        fn framing_does_not_change_the_request(
            kind in prop_oneof![Just(T_IN), Just(T_OUT)],
            data_len in 0usize..3000,
            cuts in proptest::collection::vec(1usize..700, 1..12),
        ) {
            let write = kind == T_IN;
            // The request's bytes laid end to end in guest memory at 0: header, data, status.
            let total = HEADER_LEN + data_len + 1;
            let mut m = vec![0u8; total];
            m[..16].copy_from_slice(&header(kind, 77));
            // Cut points, with the readable/writable boundary where it must be.
            let boundary = if write { HEADER_LEN } else { HEADER_LEN + data_len };
            let mut points = vec![0, boundary, total];
            let mut at = 0;
            for c in cuts { at += c; if at < total { points.push(at); } }
            points.sort_unstable();
            points.dedup();
            let chain: Vec<Desc> = points.windows(2)
                .map(|w| d(w[0] as u64, (w[1] - w[0]) as u32, w[0] >= boundary))
                .collect();
            let l = layout(&chain, 64, reader(&m)).unwrap();
            prop_assert_eq!(l.header, Header { kind, sector: 77 });
            prop_assert_eq!(l.status, total as u64 - 1);
            prop_assert_eq!(l.data_len, data_len as u64);
            let mut next = HEADER_LEN as u64;
            for &(a, n) in &l.data {
                prop_assert_eq!(a, next, "data in order, no gap");
                next += n as u64;
            }
            prop_assert_eq!(next, (HEADER_LEN + data_len) as u64);
        }
    }
}
