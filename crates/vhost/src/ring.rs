//! A virtqueue's ring, split ([`SplitRing`]) or packed ([`PackedRing`]): the operations a queue
//! ([`crate::vring`]) needs of either, so that the queue is written once.
//!
//! A chain taken from either is an [`Avail`]: its buffer id (the head's index in a split ring),
//! where it starts and how many ring slots it takes (always 1 for split; a packed ring's used
//! position moves on by it).

use crate::memory::Memory;
use crate::packed::{PackedError, PackedRing};
use crate::request::{walk_chain, walk_packed, Desc, WalkError, Walked};
use crate::split::{RingError, SplitRing};
use std::sync::Arc;

/// A chain the driver made available.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Avail {
    /// Buffer id: what the used ring names (a split ring's head).
    pub id: u16,
    /// Where it starts: the head's index in the descriptor table (split) or its ring slot
    /// (packed).
    pub slot: u16,
    /// Ring slots it takes (1 for split).
    pub count: u16,
}

/// Why the driver's ring cannot be served (the queue stops).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PopError {
    /// The split ring's available index.
    Split(RingError),
    /// The packed ring's chains.
    Packed(PackedError),
}

impl std::fmt::Display for PopError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PopError::Split(e) => write!(f, "available ring: {e}"),
            PopError::Packed(e) => write!(f, "packed ring: {e}"),
        }
    }
}

/// A queue's ring.
pub enum Ring {
    /// VIRTIO 1.2, 2.7.
    Split(SplitRing),
    /// VIRTIO 1.2, 2.8 (VIRTIO_F_RING_PACKED).
    Packed(PackedRing),
}

impl Ring {
    /// Packed.
    pub fn is_packed(&self) -> bool {
        matches!(self, Ring::Packed(_))
    }

    /// Ring size.
    pub fn size(&self) -> u16 {
        match self {
            Ring::Split(r) => r.size(),
            Ring::Packed(r) => r.size(),
        }
    }

    /// Where the next chain is taken: split, the available index; packed, the slot with the
    /// wrap counter in bit 15.
    pub fn next_avail(&self) -> u16 {
        match self {
            Ring::Split(r) => r.next_avail(),
            Ring::Packed(r) => r.next_avail().encode(),
        }
    }

    /// Where the next used entry goes (as [`Ring::next_avail`]).
    pub fn next_used(&self) -> u16 {
        match self {
            Ring::Split(r) => r.next_used(),
            Ring::Packed(r) => r.next_used().encode(),
        }
    }

    /// What VHOST_USER_GET_VRING_BASE answers: split, the next available index; packed, the
    /// available position in bits 0-15 and the used one in bits 16-31 (vhost-user's "vring
    /// descriptor indices for packed virtqueues").
    pub fn base(&self) -> u32 {
        match self {
            Ring::Split(r) => r.next_avail() as u32,
            Ring::Packed(r) => r.next_avail().encode() as u32 | (r.next_used().encode() as u32) << 16,
        }
    }

    /// Takes the next chain the driver made available.
    #[inline]
    pub fn pop(&mut self) -> Result<Option<Avail>, PopError> {
        match self {
            Ring::Split(r) => match r.pop() {
                Ok(h) => Ok(h.map(|head| Avail { id: head, slot: head, count: 1 })),
                Err(e) => Err(PopError::Split(e)),
            },
            Ring::Packed(r) => match r.pop() {
                Ok(a) => Ok(a.map(|a| Avail { id: a.id, slot: a.slot, count: a.count })),
                Err(e) => Err(PopError::Packed(e)),
            },
        }
    }

    /// Walks chain `a` into `out` (at most `max` descriptors kept, see [`Walked`]): a split
    /// ring's through the descriptor table at guest-physical `table`, a packed ring's through
    /// its slots; indirect tables are read from `mem`.
    pub fn walk(
        &self,
        a: &Avail,
        mem: &Memory,
        table: u64,
        max: usize,
        out: &mut Vec<Desc>,
    ) -> Result<Walked, WalkError> {
        let read = |at: u64| {
            let mut b = [0u8; 16];
            mem.read(at, &mut b).then_some(b)
        };
        match self {
            Ring::Split(r) => walk_chain(read, table, r.size(), a.slot, max, out),
            Ring::Packed(r) => {
                let size = r.size();
                let slot = |i: u16| r.desc_at(((a.slot as u32 + i as u32) % size as u32) as u16);
                walk_packed(slot, a.count, read, max, out)
            }
        }
    }

    /// Puts chain `a` on the used ring, `len` bytes written to the driver's buffers. Packed:
    /// returns the guest-physical range the used descriptor took (split: None; its used ring's
    /// entry and index are at known offsets).
    #[inline]
    pub fn push_used(&mut self, id: u16, len: u32, count: u16) -> Option<(u64, u32)> {
        match self {
            Ring::Split(r) => {
                r.push_used(id, len);
                None
            }
            Ring::Packed(r) => Some(r.push_used(id, len, count)),
        }
    }

    /// Whether the driver wants a signal for what was used since the last call.
    pub fn needs_signal(&mut self) -> bool {
        match self {
            Ring::Split(r) => r.needs_signal(),
            Ring::Packed(r) => r.needs_signal(),
        }
    }

    /// Tells the driver not to kick.
    pub fn disable_kicks(&mut self) {
        match self {
            Ring::Split(r) => r.disable_kicks(),
            Ring::Packed(r) => r.disable_kicks(),
        }
    }

    /// Asks the driver to kick; true if something became available meanwhile.
    pub fn enable_kicks(&mut self) -> bool {
        match self {
            Ring::Split(r) => r.enable_kicks(),
            Ring::Packed(r) => r.enable_kicks(),
        }
    }

    /// The same ring in a new mapping of guest memory, at guest-physical `addrs` (descriptors,
    /// then available ring or driver area, then used ring or device area), where it left off.
    pub fn remap(&self, mem: Arc<Memory>, addrs: (u64, u64, u64), event_idx: bool) -> Result<Ring, RingError> {
        let (desc, avail, used) = addrs;
        Ok(match self {
            Ring::Split(r) => {
                Ring::Split(SplitRing::new(mem, r.size(), avail, used, r.next_avail(), r.next_used(), event_idx)?)
            }
            Ring::Packed(r) => Ring::Packed(r.remap(mem, desc, avail, used)?),
        })
    }
}
