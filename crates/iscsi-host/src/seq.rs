//! Sequence numbers of a session (RFC 7143 section 4.2.2): the CmdSN window the target opens
//! (ExpCmdSN, MaxCmdSN) and the StatSN the initiator acknowledges, in serial number arithmetic
//! (RFC 1982, 32 bits).
//!
//! A non-immediate command takes the next CmdSN and may be sent only while that CmdSN is
//! within the window (CmdSN <= MaxCmdSN); otherwise it waits. Immediate PDUs (NOP-Out answers,
//! Logout) carry the next CmdSN without taking it. A window update whose MaxCmdSN is below
//! ExpCmdSN - 1 is ignored, as RFC 7143 says; others only ever move the window forward.

/// `a < b` in serial arithmetic.
pub fn sn_lt(a: u32, b: u32) -> bool {
    a != b && b.wrapping_sub(a) < (1 << 31)
}

/// `a <= b` in serial arithmetic.
pub fn sn_le(a: u32, b: u32) -> bool {
    a == b || sn_lt(a, b)
}

/// The CmdSN window and the StatSN of one connection's session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// The CmdSN the next non-immediate command takes.
    cmd_sn: u32,
    /// The target's ExpCmdSN.
    exp_cmd_sn: u32,
    /// The target's MaxCmdSN.
    max_cmd_sn: u32,
    /// The StatSN expected next (what the initiator acknowledges as ExpStatSN).
    exp_stat_sn: u32,
}

impl Window {
    /// The window a login leaves: the target's ExpCmdSN and MaxCmdSN, the next StatSN.
    pub fn new(exp_cmd_sn: u32, max_cmd_sn: u32, exp_stat_sn: u32) -> Window {
        let mut w = Window { cmd_sn: exp_cmd_sn, exp_cmd_sn, max_cmd_sn: exp_cmd_sn.wrapping_sub(1), exp_stat_sn };
        w.update(exp_cmd_sn, max_cmd_sn);
        w
    }

    /// True if a non-immediate command may be sent now.
    pub fn open(&self) -> bool {
        sn_le(self.cmd_sn, self.max_cmd_sn)
    }

    /// Commands that may still be sent before the window closes.
    pub fn room(&self) -> u32 {
        if self.open() {
            self.max_cmd_sn.wrapping_sub(self.cmd_sn).wrapping_add(1)
        } else {
            0
        }
    }

    /// Takes the next CmdSN for a non-immediate command (the caller checked [`Window::open`]).
    pub fn take(&mut self) -> u32 {
        debug_assert!(self.open(), "a command sent outside the CmdSN window");
        let sn = self.cmd_sn;
        self.cmd_sn = sn.wrapping_add(1);
        sn
    }

    /// The CmdSN an immediate PDU carries (not taken).
    pub fn next(&self) -> u32 {
        self.cmd_sn
    }

    /// The ExpStatSN to send.
    pub fn exp_stat_sn(&self) -> u32 {
        self.exp_stat_sn
    }

    /// The target's MaxCmdSN.
    pub fn max_cmd_sn(&self) -> u32 {
        self.max_cmd_sn
    }

    /// Takes ExpCmdSN and MaxCmdSN from a target PDU; true if the window grew.
    pub fn update(&mut self, exp: u32, max: u32) -> bool {
        if sn_lt(max, exp.wrapping_sub(1)) {
            return false;
        }
        if sn_lt(self.exp_cmd_sn, exp) {
            self.exp_cmd_sn = exp;
        }
        if sn_lt(self.max_cmd_sn, max) {
            self.max_cmd_sn = max;
            return true;
        }
        false
    }

    /// A status numbered `stat_sn` arrived: the next one is expected after it.
    pub fn status(&mut self, stat_sn: u32) {
        let next = stat_sn.wrapping_add(1);
        if sn_lt(self.exp_stat_sn, next) {
            self.exp_stat_sn = next;
        }
    }

    /// True if the target's ExpCmdSN claims commands this end never sent.
    pub fn exp_beyond_sent(&self) -> bool {
        sn_lt(self.cmd_sn, self.exp_cmd_sn)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_arithmetic_wraps() {
        assert!(sn_lt(1, 2) && !sn_lt(2, 1) && !sn_lt(3, 3));
        assert!(sn_lt(u32::MAX, 0), "0 follows 2^32 - 1");
        assert!(sn_lt(u32::MAX - 5, 4));
        assert!(sn_le(7, 7) && sn_le(u32::MAX, 1));
    }

    #[test]
    fn commands_wait_when_the_window_closes() {
        // A queue depth of 2: ExpCmdSN 10, MaxCmdSN 11.
        let mut w = Window::new(10, 11, 5);
        assert_eq!(w.room(), 2);
        assert_eq!(w.take(), 10);
        assert_eq!(w.take(), 11);
        assert!(!w.open(), "CmdSN 12 is beyond MaxCmdSN 11");
        assert_eq!(w.next(), 12, "immediate PDUs carry the next CmdSN");
        // The target finished one: MaxCmdSN 12.
        assert!(w.update(11, 12));
        assert!(w.open());
        assert_eq!(w.take(), 12);
        // A stale update (an older PDU) moves nothing back.
        assert!(!w.update(10, 11));
        assert_eq!(w.max_cmd_sn(), 12);
        // MaxCmdSN = ExpCmdSN - 1: the target holds the window shut.
        assert!(!w.update(13, 12));
        assert!(!w.open());
        // MaxCmdSN below ExpCmdSN - 1 is invalid and ignored.
        assert!(!w.update(20, 5));
        assert_eq!(w.max_cmd_sn(), 12);
    }

    #[test]
    fn the_window_wraps_around_zero() {
        let mut w = Window::new(u32::MAX - 1, 1, 0);
        assert_eq!(w.room(), 4);
        for want in [u32::MAX - 1, u32::MAX, 0, 1] {
            assert_eq!(w.take(), want);
        }
        assert!(!w.open());
        assert!(w.update(2, 3));
        assert_eq!(w.room(), 2);
    }

    #[test]
    fn stat_sn_moves_forward_only() {
        let mut w = Window::new(1, 1, 100);
        w.status(100);
        assert_eq!(w.exp_stat_sn(), 101);
        w.status(50);
        assert_eq!(w.exp_stat_sn(), 101);
        w.status(u32::MAX);
        assert_eq!(w.exp_stat_sn(), 101, "far behind in serial arithmetic");
    }

    #[test]
    fn a_target_acknowledging_unsent_commands_is_seen() {
        let mut w = Window::new(1, 10, 0);
        w.take();
        assert!(!w.exp_beyond_sent());
        w.update(2, 10);
        assert!(!w.exp_beyond_sent());
        w.update(5, 10);
        assert!(w.exp_beyond_sent());
    }
}
