//! A connection's tasks: one slot per outstanding command, its Initiator Task Tag made of the
//! slot and the slot's generation, and its phases (the kit's `Flight`, as the NVMe/TCP host's).
//!
//! The ITT is the slot in the low 16 bits and the slot's generation (how many commands it
//! started) above, so that a PDU naming a command that has ended (a repeated or late
//! response) names no task instead of the slot's next command: it is the target's error and
//! the connection is dropped.

use crate::plan::{R2ts, ReadProgress};
use crate::scsi::Sense;
use ferrite_reactor::IoBuf;
use ferrite_target::host::{Flight, Reads};

/// The answer to a command sent for the connection's own use (at attach: INQUIRY, READ
/// CAPACITY...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// SCSI status.
    pub status: u8,
    /// Sense data, with CHECK CONDITION.
    pub sense: Option<Sense>,
    /// The data read (what arrived of it).
    pub data: Vec<u8>,
}

/// Who waits for a task: a bdev request, or a command of the connection's own (the kit's).
pub(crate) type Owner = ferrite_target::host::Owner<Reply>;

/// How a task ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// With a SCSI status (and sense).
    Status {
        /// SCSI status.
        status: u8,
        /// Sense data.
        sense: Option<Sense>,
    },
    /// The target refused the command (a Reject, a failed iSCSI Response).
    Refused,
}

/// One slot.
#[derive(Default)]
pub(crate) struct Task {
    /// Where it stands, the PDUs carrying its data not yet sent, and how it ended while it
    /// waits for them (the kit's).
    pub(crate) flight: Flight<Ended>,
    /// Who waits for it.
    pub(crate) owner: Option<Owner>,
    /// How many commands the slot started (wrapping): the ITT's high half.
    pub(crate) gen: u16,
    /// Expected Data Transfer Length.
    pub(crate) len: u32,
    /// Data flows to the initiator.
    pub(crate) read: bool,
    /// A read's progress.
    pub(crate) progress: ReadProgress,
    /// A write's R2Ts so far (the next R2TSN, where the data asked for ends, those whose
    /// answer is still being sent).
    pub(crate) r2ts: R2ts,
    /// Data it sends other than the request's buffers (an UNMAP parameter list).
    pub(crate) extra: Option<IoBuf>,
    /// Its CmdSN (a lost connection's commands are sent again in this order).
    pub(crate) cmd_sn: u32,
    /// The connection's tick when it was sent (its timeout counts from there).
    pub(crate) tick: u32,
}

impl Task {
    /// Starts the slot's next command: everything a command leaves behind is reset here.
    pub(crate) fn begin(&mut self, owner: Owner, len: u32, read: bool, extra: Option<IoBuf>, cmd_sn: u32, tick: u32) {
        debug_assert!(self.owner.is_none(), "a free slot holds nothing");
        self.owner = Some(owner);
        self.gen = self.gen.wrapping_add(1);
        self.len = len;
        self.read = read;
        self.progress = ReadProgress::default();
        self.r2ts = R2ts::default();
        self.extra = extra;
        self.cmd_sn = cmd_sn;
        self.tick = tick;
    }

    /// The ITT of slot `slot` in its current generation.
    pub(crate) fn itt(&self, slot: u16) -> u32 {
        itt(slot, self.gen)
    }

    /// The scatter list of the data it moves (its request's buffers, its extra data, or its
    /// own command's buffer), as pointers.
    pub(crate) fn data_pieces(&self, out: &mut smallvec::SmallVec<[(*const u8, usize); 4]>) {
        out.clear();
        match (&self.extra, &self.owner) {
            (Some(b), _) => out.push((b.as_ptr(), b.len())),
            (None, Some(Owner::Bdev(io))) => out.extend(io.req.bufs.iter().map(|b| (b.as_ptr(), b.len()))),
            (None, Some(Owner::Wait { out: Some(b), .. })) => out.push((b.as_ptr(), b.len())),
            (None, Some(Owner::Wait { inb: Some(b), .. })) => out.push((b.as_ptr(), b.len())),
            _ => {}
        }
    }
}

impl Reads for Task {
    fn read_bufs(&mut self) -> Option<&mut [IoBuf]> {
        self.owner.as_mut().and_then(Owner::read_bufs)
    }

    fn received(&mut self, n: u32) {
        self.progress.got = self.progress.got.saturating_add(n);
    }
}

/// The ITT of a slot's command of generation `gen`.
pub(crate) fn itt(slot: u16, gen: u16) -> u32 {
    u32::from(gen) << 16 | u32::from(slot)
}

/// The slot an ITT names.
pub(crate) fn slot_of(itt: u32) -> u16 {
    itt as u16
}

/// The generation an ITT names.
pub(crate) fn gen_of(itt: u32) -> u16 {
    (itt >> 16) as u16
}

/// The ITT of the Logout Request (no slot has it: the slots are fewer).
pub(crate) const LOGOUT_ITT: u32 = 0xffff_fffe;

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_reactor::oneshot;

    #[test]
    fn itts_name_slot_and_generation() {
        let mut t = Task::default();
        let (tx, _rx) = oneshot::channel();
        t.begin(Owner::Wait { tx, out: None, inb: None }, 0, false, None, 1, 0);
        let a = t.itt(7);
        assert_eq!((slot_of(a), gen_of(a)), (7, 1));
        t.owner = None;
        let (tx, _rx) = oneshot::channel();
        t.begin(Owner::Wait { tx, out: None, inb: None }, 0, false, None, 2, 0);
        assert_ne!(t.itt(7), a, "the slot's next command has another ITT");
        for gen in [0, u16::MAX] {
            // Slots are fewer than 0xfffe: no ITT is the reserved tag or the Logout's.
            assert_ne!(itt(1023, gen), ferrite_iscsi::pdu::RESERVED_TAG);
            assert_ne!(itt(1023, gen), LOGOUT_ITT);
        }
        assert_eq!(slot_of(LOGOUT_ITT), 0xfffe);
    }
}
