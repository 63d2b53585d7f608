//! The sequence numbers of a connection and its session (one connection per session, so they
//! live together): StatSN, and the command window ExpCmdSN..=MaxCmdSN (RFC 7143 sections
//! 4.2.2.1 and 4.2.2.2), as SPDK keeps it: MaxCmdSN starts `queue depth - 1` above ExpCmdSN
//! and moves by one each time a non-immediate command is finished (answered, or ended without
//! an answer), so at most `queue depth` of them are ever outstanding.

use std::cell::Cell;

/// What to do with a request given its CmdSN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CmdSnVerdict {
    /// In the window (or the expected immediate one): serve it.
    Accept,
    /// Outside the window: ignore it silently (RFC 7143 section 4.2.2.1).
    Drop,
    /// An immediate request whose CmdSN is not ExpCmdSN: a protocol error that ends the
    /// connection at ErrorRecoveryLevel 0 (as SPDK).
    Fatal,
}

/// True if `a` < `b` in serial number arithmetic (RFC 1982, 32 bits).
pub(crate) fn sn_lt(a: u32, b: u32) -> bool {
    a != b && (a.wrapping_sub(b) as i32) < 0
}

/// StatSN and the command window.
#[derive(Debug, Default)]
pub(crate) struct Seq {
    stat_sn: Cell<u32>,
    exp_cmd_sn: Cell<u32>,
    max_cmd_sn: Cell<u32>,
}

impl Seq {
    /// Starts the full feature phase: the next StatSN, the next CmdSN expected and the window.
    pub(crate) fn start(&self, stat_sn: u32, exp_cmd_sn: u32, window: u32) {
        debug_assert!(window >= 1);
        self.stat_sn.set(stat_sn);
        self.exp_cmd_sn.set(exp_cmd_sn);
        self.max_cmd_sn.set(exp_cmd_sn.wrapping_add(window - 1));
    }

    /// Checks a request's CmdSN; a non-immediate one in the window moves ExpCmdSN past it.
    /// NOP-Outs are let through with any CmdSN when immediate (Linux's initiator sends stale
    /// ones under load; SPDK lets them through too).
    pub(crate) fn check(&self, cmd_sn: u32, immediate: bool, nop: bool) -> CmdSnVerdict {
        let exp = self.exp_cmd_sn.get();
        if immediate {
            return if cmd_sn == exp || nop { CmdSnVerdict::Accept } else { CmdSnVerdict::Fatal };
        }
        if sn_lt(cmd_sn, exp) || sn_lt(self.max_cmd_sn.get(), cmd_sn) {
            return CmdSnVerdict::Drop;
        }
        self.exp_cmd_sn.set(cmd_sn.wrapping_add(1));
        CmdSnVerdict::Accept
    }

    /// True if `cmd_sn` lies in the window (for ABORT TASK's RefCmdSN).
    pub(crate) fn in_window(&self, cmd_sn: u32) -> bool {
        !sn_lt(cmd_sn, self.exp_cmd_sn.get()) && !sn_lt(self.max_cmd_sn.get(), cmd_sn)
    }

    /// A non-immediate request was finished: the window opens by one.
    pub(crate) fn open(&self) {
        self.max_cmd_sn.set(self.max_cmd_sn.get().wrapping_add(1));
        debug_assert!(!sn_lt(self.max_cmd_sn.get(), self.exp_cmd_sn.get().wrapping_sub(1)));
    }

    /// The StatSN to put in a status PDU; the next one is one more.
    pub(crate) fn take_stat_sn(&self) -> u32 {
        let s = self.stat_sn.get();
        self.stat_sn.set(s.wrapping_add(1));
        s
    }

    /// The next StatSN, without advancing it (R2T, Data-In without status, unsolicited
    /// NOP-In).
    pub(crate) fn stat_sn(&self) -> u32 {
        self.stat_sn.get()
    }

    /// ExpCmdSN.
    pub(crate) fn exp_cmd_sn(&self) -> u32 {
        self.exp_cmd_sn.get()
    }

    /// MaxCmdSN.
    pub(crate) fn max_cmd_sn(&self) -> u32 {
        self.max_cmd_sn.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_follows_spdks_rules() {
        let s = Seq::default();
        s.start(7, 10, 2);
        assert_eq!((s.exp_cmd_sn(), s.max_cmd_sn()), (10, 11));
        assert_eq!(s.check(9, false, false), CmdSnVerdict::Drop, "below the window");
        assert_eq!(s.check(12, false, false), CmdSnVerdict::Drop, "above the window");
        assert_eq!(s.check(11, true, false), CmdSnVerdict::Fatal, "an immediate one must carry ExpCmdSN");
        assert_eq!(s.check(11, true, true), CmdSnVerdict::Accept, "but a NOP-Out may not");
        assert_eq!(s.check(10, true, false), CmdSnVerdict::Accept);
        assert_eq!(s.exp_cmd_sn(), 10, "immediate requests do not move ExpCmdSN");
        assert_eq!(s.check(10, false, false), CmdSnVerdict::Accept);
        assert_eq!(s.check(11, false, false), CmdSnVerdict::Accept);
        assert_eq!(s.check(12, false, false), CmdSnVerdict::Drop, "the window is full");
        s.open();
        assert!(s.in_window(12) && !s.in_window(11));
        assert_eq!(s.check(12, false, false), CmdSnVerdict::Accept);
        assert_eq!((s.take_stat_sn(), s.stat_sn()), (7, 8));
    }

    #[test]
    fn serial_numbers_wrap() {
        let s = Seq::default();
        s.start(0, u32::MAX, 4);
        assert_eq!(s.max_cmd_sn(), 2);
        assert_eq!(s.check(u32::MAX, false, false), CmdSnVerdict::Accept);
        assert_eq!(s.check(0, false, false), CmdSnVerdict::Accept);
        assert!(sn_lt(u32::MAX, 0) && !sn_lt(0, u32::MAX));
        assert_eq!(s.check(u32::MAX - 1, false, false), CmdSnVerdict::Drop);
    }
}
