//! RAID levels and how each maps the RAID bdev's blocks onto its members' data regions: pure
//! arithmetic, with no I/O (SPDK's raid0.c `_raid0_get_io_range`/`_raid0_split_io_range` and
//! concat.c's block ranges, raid5f.c's stripes and rotating parity).

/// A RAID level, with SPDK's numbers (`enum spdk_bdev_raid_level`, stored in the superblock).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    /// Striping: strip `s` of the RAID is strip `s / n` of member `s % n`.
    Raid0,
    /// Mirroring: every member holds every block.
    Raid1,
    /// Concatenation: the members' data regions one after another (in strips).
    Concat,
    /// Striping with one rotating parity strip per stripe (SPDK's raid5f): stripe `s` is strip
    /// `s` of every member, its parity on member `n - 1 - s % n` and its data strips on the
    /// others in order. Writes are whole stripes only.
    Raid5f,
}

impl Level {
    /// SPDK's number of the level.
    pub fn number(self) -> u32 {
        match self {
            Level::Raid0 => 0,
            Level::Raid1 => 1,
            Level::Concat => 99,
            Level::Raid5f => 95,
        }
    }

    /// The level with SPDK's number `n`, if Ferrite has it.
    pub fn from_number(n: u32) -> Option<Level> {
        match n {
            0 => Some(Level::Raid0),
            1 => Some(Level::Raid1),
            99 => Some(Level::Concat),
            95 => Some(Level::Raid5f),
            _ => None,
        }
    }

    /// SPDK's name of the level (`raid_level` of the RPCs).
    pub fn name(self) -> &'static str {
        match self {
            Level::Raid0 => "raid0",
            Level::Raid1 => "raid1",
            Level::Concat => "concat",
            Level::Raid5f => "raid5f",
        }
    }

    /// The level SPDK's name `s` stands for (case-insensitive, and SPDK's aliases "0", "1" and "5f").
    pub fn parse(s: &str) -> Option<Level> {
        match s.to_ascii_lowercase().as_str() {
            "raid0" | "0" => Some(Level::Raid0),
            "raid1" | "1" => Some(Level::Raid1),
            "concat" => Some(Level::Concat),
            "raid5f" | "5f" => Some(Level::Raid5f),
            _ => None,
        }
    }

    /// Fewest members the level is made of (SPDK's `base_bdevs_min`).
    pub fn min_members(self) -> usize {
        match self {
            Level::Raid1 => 2,
            Level::Raid5f => 3,
            _ => 1,
        }
    }

    /// Fewest members that must work for the RAID to serve I/O (SPDK's constraint): every one
    /// for raid0 and concat, one for raid1, all but one for raid5f.
    pub fn min_operational(self, members: usize) -> usize {
        match self {
            Level::Raid1 => 1,
            Level::Raid5f => members - 1,
            _ => members,
        }
    }

    /// True if the level uses a strip size.
    pub fn striped(self) -> bool {
        self != Level::Raid1
    }
}

/// The slot holding the parity strip of raid5f stripe `stripe` over `n` members (SPDK's
/// `raid5f_stripe_parity_chunk_index`: the last member for stripe 0, then one lower each
/// stripe).
#[inline]
pub fn raid5f_parity_slot(stripe: u64, n: usize) -> usize {
    debug_assert!(n >= 3);
    n - 1 - (stripe % n as u64) as usize
}

/// The slot holding data strip `k` (0 ≤ k < n − 1) of raid5f stripe `stripe` over `n` members:
/// the data strips fill the slots in order, skipping the parity's.
#[inline]
pub fn raid5f_data_slot(stripe: u64, k: usize, n: usize) -> usize {
    debug_assert!(k < n - 1);
    let p = raid5f_parity_slot(stripe, n);
    if k < p {
        k
    } else {
        k + 1
    }
}

/// A piece of a RAID request on one member: blocks `[off, off + blocks)` of the member's data
/// region, carrying bytes `[pos, pos + blocks × block size)` of the request's payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// The member's slot.
    pub slot: usize,
    /// First block in the member's data region.
    pub off: u64,
    /// Blocks.
    pub blocks: u64,
    /// Blocks of the RAID request before this piece (its payload starts there).
    pub pos: u64,
}

/// The pieces of raid0 request `[off, off + num)` over `n` members with `strip` blocks per strip,
/// one per strip (in payload order): what reads and writes split into.
pub fn raid0_strips(off: u64, num: u64, n: usize, strip: u64, mut f: impl FnMut(Piece)) {
    debug_assert!(strip.is_power_of_two() && n > 0);
    let (n64, end) = (n as u64, off + num);
    let mut at = off;
    while at < end {
        let s = at / strip;
        let in_strip = at % strip;
        let blocks = (strip - in_strip).min(end - at);
        f(Piece { slot: (s % n64) as usize, off: (s / n64) * strip + in_strip, blocks, pos: at - off });
        at += blocks;
    }
}

/// The range of raid0 request `[off, off + num)` on member `d` of `n` (SPDK's
/// `_raid0_split_io_range`): consecutive strips of one member lie back to back on it, so a
/// range of the RAID is one range on each member it touches. None if it touches no block of
/// `d`. For unmap, write zeroes and flush.
pub fn raid0_member_range(off: u64, num: u64, n: usize, strip: u64, d: usize) -> Option<(u64, u64)> {
    if num == 0 {
        return None;
    }
    let (n, d) = (n as u64, d as u64);
    let (first, last) = (off / strip, (off + num - 1) / strip);
    // The first strip of member d at or after `first`, and the last at or before `last`.
    let s0 = first + (d + n - first % n) % n;
    let back = (last % n + n - d) % n;
    if back > last {
        return None;
    }
    let s1 = last - back;
    if s0 > s1 {
        return None;
    }
    let start = (s0 / n) * strip + if s0 == first { off % strip } else { 0 };
    let end = (s1 / n) * strip + if s1 == last { (off + num - 1) % strip + 1 } else { strip };
    Some((start, end - start))
}

/// The pieces of concat request `[off, off + num)` over members of `sizes` blocks each (in
/// slot order), in payload order.
pub fn concat_pieces(off: u64, num: u64, sizes: &[u64], mut f: impl FnMut(Piece)) {
    let end = off + num;
    let mut start = 0u64;
    for (slot, &len) in sizes.iter().enumerate() {
        let (lo, hi) = (off.max(start), end.min(start + len));
        if lo < hi {
            f(Piece { slot, off: lo - start, blocks: hi - lo, pos: lo - off });
        }
        start += len;
        if start >= end {
            break;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where block `b` of a raid0 lives, one block at a time.
    fn where_raid0(b: u64, n: usize, strip: u64) -> (usize, u64) {
        let s = b / strip;
        ((s % n as u64) as usize, (s / n as u64) * strip + b % strip)
    }

    #[test]
    fn names_and_numbers_are_spdks() {
        for l in [Level::Raid0, Level::Raid1, Level::Concat, Level::Raid5f] {
            assert_eq!(Level::parse(l.name()), Some(l));
            assert_eq!(Level::from_number(l.number()), Some(l));
        }
        assert_eq!(Level::parse("RAID1"), Some(Level::Raid1));
        assert_eq!(Level::parse("raid5"), None);
        assert_eq!(Level::from_number(5), None);
        assert_eq!(Level::from_number(95), Some(Level::Raid5f));
        assert_eq!(Level::Raid5f.min_operational(4), 3);
        assert_eq!(Level::Raid1.min_operational(3), 1);
        assert_eq!(Level::Raid0.min_operational(3), 3);
    }

    #[test]
    fn raid5f_parity_rotates_as_spdks() {
        // SPDK: parity index = data chunks - stripe % members.
        let n = 4;
        let parity: Vec<usize> = (0..8).map(|s| raid5f_parity_slot(s, n)).collect();
        assert_eq!(parity, vec![3, 2, 1, 0, 3, 2, 1, 0]);
        for s in 0..8u64 {
            let data: Vec<usize> = (0..n - 1).map(|k| raid5f_data_slot(s, k, n)).collect();
            let mut all = data.clone();
            all.push(raid5f_parity_slot(s, n));
            all.sort_unstable();
            assert_eq!(all, vec![0, 1, 2, 3], "stripe {s}: every slot once");
            assert!(data.windows(2).all(|w| w[0] < w[1]), "data strips in slot order");
        }
    }

    #[test]
    fn raid0_strips_cover_every_block_where_it_lives() {
        for n in 1..5 {
            for strip in [1u64, 4, 8] {
                for off in 0..40 {
                    for num in 1..30 {
                        let mut next = 0;
                        raid0_strips(off, num, n, strip, |p| {
                            assert_eq!(p.pos, next);
                            for i in 0..p.blocks {
                                assert_eq!(where_raid0(off + p.pos + i, n, strip), (p.slot, p.off + i));
                            }
                            next += p.blocks;
                        });
                        assert_eq!(next, num);
                    }
                }
            }
        }
    }

    #[test]
    fn raid0_member_ranges_are_the_blocks_each_member_holds() {
        for n in 1..5 {
            for strip in [1u64, 4, 8] {
                for off in 0..40 {
                    for num in 0..40 {
                        for d in 0..n {
                            let mut want: Vec<u64> = (off..off + num)
                                .map(|b| where_raid0(b, n, strip))
                                .filter(|w| w.0 == d)
                                .map(|w| w.1)
                                .collect();
                            want.sort_unstable();
                            let got = raid0_member_range(off, num, n, strip, d)
                                .map(|(s, l)| (s..s + l).collect::<Vec<_>>())
                                .unwrap_or_default();
                            assert_eq!(got, want, "n {n} strip {strip} off {off} num {num} member {d}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn concat_pieces_walk_the_members_in_order() {
        let sizes = [8u64, 4, 16];
        let mut got = Vec::new();
        concat_pieces(6, 10, &sizes, |p| got.push(p));
        assert_eq!(
            got,
            vec![
                Piece { slot: 0, off: 6, blocks: 2, pos: 0 },
                Piece { slot: 1, off: 0, blocks: 4, pos: 2 },
                Piece { slot: 2, off: 0, blocks: 4, pos: 6 }
            ]
        );
        got.clear();
        concat_pieces(12, 16, &sizes, |p| got.push(p));
        assert_eq!(got, vec![Piece { slot: 2, off: 0, blocks: 16, pos: 0 }]);
    }
}
