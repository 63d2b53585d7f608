//! NOP-Out and NOP-In (RFC 7143 sections 11.18 and 11.19): an initiator's ping is answered
//! with its data echoed (the StatSN advances); the target pings an idle initiator every
//! `nop_in_interval` seconds with a NOP-In carrying a TTT (the StatSN does not advance), which
//! the initiator answers with a NOP-Out carrying it back (the watchdog drops a connection whose
//! answer does not come within `nop_timeout`).

use super::conn::Conn;
use ferrite_iscsi::pdu::{NopIn, NopOut, Pdu, RESERVED_TAG};

/// A NOP-Out (its CmdSN accepted) with its ping data.
pub(crate) fn on_nop_out(c: &Conn, n: &NopOut, data: &[u8]) {
    if n.ttt != RESERVED_TAG {
        // The answer to our NOP-In (ITT 0xffffffff, immediate).
        let mut st = c.nop.get();
        if st.outstanding.is_some_and(|(ttt, _)| ttt == n.ttt) {
            st.outstanding = None;
            c.nop.set(st);
        }
    }
    if n.itt == RESERVED_TAG {
        // No answer asked for.
        return;
    }
    c.finished(n.immediate);
    let pdu = Pdu::NopIn(NopIn {
        lun: n.lun,
        itt: n.itt,
        ttt: RESERVED_TAG,
        stat_sn: c.seq.take_stat_sn(),
        exp_cmd_sn: c.seq.exp_cmd_sn(),
        max_cmd_sn: c.seq.max_cmd_sn(),
    });
    c.send_pdu(&pdu, data);
}

/// Pings the initiator (from the watchdog, at tick `now`).
pub(crate) fn ping(c: &Conn, now: u64) {
    if c.is_closing() {
        return;
    }
    let ttt = c.next_ttt();
    c.nop.set(super::conn::NopState { outstanding: Some((ttt, now)), last: now });
    let pdu = Pdu::NopIn(NopIn {
        lun: 0,
        itt: RESERVED_TAG,
        ttt,
        stat_sn: c.seq.stat_sn(),
        exp_cmd_sn: c.seq.exp_cmd_sn(),
        max_cmd_sn: c.seq.max_cmd_sn(),
    });
    c.send_pdu(&pdu, &[]);
}
