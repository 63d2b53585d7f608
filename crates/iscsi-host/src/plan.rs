//! How a command's data moves under what the login settled, and the checks of what the
//! target sends for it (pure: the connection applies them).
//!
//! A write's data goes in three parts (RFC 7143 sections 13.10-13.14): immediate data in the
//! command PDU (ImmediateData=Yes: at most FirstBurstLength and the target's
//! MaxRecvDataSegmentLength), unsolicited Data-Out PDUs up to FirstBurstLength
//! (InitialR2T=No), and the rest on the target's R2Ts, each answered with Data-Out PDUs of at
//! most the target's MaxRecvDataSegmentLength. A read's Data-In PDUs must come in order
//! (DataPDUInOrder=Yes, DataSequenceInOrder=Yes, as the initiator offers), each where the last
//! ended, numbered from 0, within the expected length.

use ferrite_iscsi::negotiate::Negotiated;

/// What the login settled that shapes data transfers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Xfer {
    /// ImmediateData.
    pub immediate_data: bool,
    /// InitialR2T.
    pub initial_r2t: bool,
    /// FirstBurstLength.
    pub first_burst: u32,
    /// MaxBurstLength.
    pub max_burst: u32,
    /// The target's MaxRecvDataSegmentLength: the most data in one PDU this end sends.
    pub max_send_segment: u32,
    /// MaxOutstandingR2T: R2Ts of one command whose data is not all sent yet.
    pub max_r2t: u32,
}

impl Xfer {
    /// The transfer rules of a login's outcome.
    pub fn of(n: &Negotiated) -> Xfer {
        Xfer {
            immediate_data: n.session.immediate_data,
            initial_r2t: n.session.initial_r2t,
            first_burst: n.session.first_burst_length,
            max_burst: n.session.max_burst_length,
            max_send_segment: n.connection.max_send_data_segment_length.max(512),
            max_r2t: u32::from(n.session.max_outstanding_r2t).max(1),
        }
    }
}

/// The unsolicited part of a write of `len` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WritePlan {
    /// Bytes of immediate data in the command PDU.
    pub immediate: u32,
    /// Unsolicited Data-Out PDUs carry the bytes from `immediate` to here.
    pub unsolicited_end: u32,
}

impl WritePlan {
    /// The command PDU's F bit: no unsolicited Data-Out follows it.
    pub fn final_bit(&self) -> bool {
        self.unsolicited_end == self.immediate
    }
}

/// The unsolicited part of a write of `len` bytes under `x`.
pub fn plan_write(len: u32, x: &Xfer) -> WritePlan {
    let unsolicited = if x.immediate_data || !x.initial_r2t { len.min(x.first_burst) } else { 0 };
    let immediate = if x.immediate_data { unsolicited.min(x.max_send_segment) } else { 0 };
    let unsolicited_end = if x.initial_r2t { immediate } else { unsolicited };
    WritePlan { immediate, unsolicited_end }
}

/// The PDUs of the data from `start` to `end` at most `max` bytes each: (offset, length,
/// last).
pub fn segments(start: u32, end: u32, max: u32) -> impl Iterator<Item = (u32, u32, bool)> {
    let max = max.max(1);
    let mut at = start;
    std::iter::from_fn(move || {
        if at >= end {
            return None;
        }
        let n = (end - at).min(max);
        let seg = (at, n, at + n == end);
        at += n;
        Some(seg)
    })
}

/// A write's R2Ts so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct R2ts {
    /// The R2TSN the command's next R2T must carry.
    pub want_sn: u32,
    /// Where the data sent or solicited so far ends (immediate, unsolicited, earlier R2Ts):
    /// with DataSequenceInOrder=Yes the next R2T starts there or later.
    pub end: u32,
    /// R2Ts whose Data-Out PDUs are not all sent yet.
    pub outstanding: u32,
}

impl R2ts {
    /// A write whose unsolicited data (immediate and unsolicited Data-Out) ends at `end`.
    pub fn after(end: u32) -> R2ts {
        R2ts { want_sn: 0, end, outstanding: 0 }
    }

    /// An R2T for `desired` bytes at `offset`, checked by [`r2t_wrong`], is answered.
    pub fn take(&mut self, offset: u32, desired: u32) {
        self.want_sn = self.want_sn.wrapping_add(1);
        self.end = offset.saturating_add(desired);
        self.outstanding += 1;
    }

    /// The last Data-Out of an R2T's answer has been sent.
    pub fn answered(&mut self) {
        debug_assert!(self.outstanding > 0, "an R2T answered twice");
        self.outstanding = self.outstanding.saturating_sub(1);
    }
}

/// What an R2T asks of a write of `len` bytes, checked against the command's R2Ts so far `r`:
/// None if it is fine, else what is wrong. Each answered R2T's data is queued at once, so an
/// R2T past MaxOutstandingR2T, or one asking again for data already solicited or sent, would
/// make this end queue data without bound.
pub fn r2t_wrong(len: u32, x: &Xfer, r: &R2ts, r2t_sn: u32, offset: u32, desired: u32) -> Option<String> {
    let want_sn = r.want_sn;
    if desired == 0 {
        Some("an R2T for no data".into())
    } else if u64::from(offset) + u64::from(desired) > u64::from(len) {
        Some(format!("an R2T for {desired} bytes at offset {offset}, past the command's {len}"))
    } else if desired > x.max_burst {
        Some(format!("an R2T for {desired} bytes, over MaxBurstLength {}", x.max_burst))
    } else if r2t_sn != want_sn {
        Some(format!("R2TSN {r2t_sn}, expected {want_sn}"))
    } else if offset < r.end {
        Some(format!("an R2T for offset {offset}, before the end ({}) of the data already sent or solicited", r.end))
    } else if r.outstanding >= x.max_r2t {
        Some(format!("an R2T beyond MaxOutstandingR2T {} for the command", x.max_r2t))
    } else {
        None
    }
}

/// Where a read's data stands: what arrived, and the DataSN expected next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReadProgress {
    /// Bytes placed (Data-In PDUs come in order, so this is also where the next starts).
    pub got: u32,
    /// DataSN of the next Data-In PDU.
    pub data_sn: u32,
}

impl ReadProgress {
    /// Checks a Data-In PDU for a read of `len` bytes: None if it is fine, else what is
    /// wrong; a fine one moves the DataSN on (its data moves `got` as it is placed).
    pub fn take(&mut self, len: u32, data_sn: u32, offset: u32, data_len: u32) -> Option<String> {
        if data_sn != self.data_sn {
            return Some(format!("Data-In DataSN {data_sn}, expected {}", self.data_sn));
        }
        if offset != self.got {
            return Some(format!(
                "Data-In at offset {offset}, but the data so far ends at {} (out of order or repeated)",
                self.got
            ));
        }
        if u64::from(offset) + u64::from(data_len) > u64::from(len) {
            return Some(format!("Data-In of {data_len} bytes at offset {offset}, past the expected {len}"));
        }
        self.data_sn = self.data_sn.wrapping_add(1);
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn x(immediate_data: bool, initial_r2t: bool) -> Xfer {
        Xfer { immediate_data, initial_r2t, first_burst: 65536, max_burst: 262144, max_send_segment: 8192, max_r2t: 1 }
    }

    #[test]
    fn writes_follow_immediate_data_and_initial_r2t() {
        // Immediate data only (Ferrite's and SPDK's targets: InitialR2T=Yes).
        let p = plan_write(1 << 20, &x(true, true));
        assert_eq!(p, WritePlan { immediate: 8192, unsolicited_end: 8192 });
        assert!(p.final_bit());
        assert_eq!(plan_write(4096, &x(true, true)), WritePlan { immediate: 4096, unsolicited_end: 4096 });
        // Unsolicited Data-Out up to FirstBurstLength after the immediate data.
        let p = plan_write(1 << 20, &x(true, false));
        assert_eq!(p, WritePlan { immediate: 8192, unsolicited_end: 65536 });
        assert!(!p.final_bit());
        let p = plan_write(1 << 20, &x(false, false));
        assert_eq!(p, WritePlan { immediate: 0, unsolicited_end: 65536 });
        assert!(!p.final_bit());
        // Neither: everything on R2Ts.
        let p = plan_write(1 << 20, &x(false, true));
        assert_eq!(p, WritePlan { immediate: 0, unsolicited_end: 0 });
        assert!(p.final_bit());
        assert_eq!(plan_write(0, &x(true, false)), WritePlan { immediate: 0, unsolicited_end: 0 });
    }

    #[test]
    fn segments_cut_at_the_segment_length() {
        let s: Vec<_> = segments(8192, 8192 + 20000, 8192).collect();
        assert_eq!(s, [(8192, 8192, false), (16384, 8192, false), (24576, 3616, true)]);
        assert_eq!(segments(5, 5, 10).count(), 0);
    }

    #[test]
    fn r2ts_are_checked() {
        let x = x(true, true);
        let r = R2ts::after(0);
        assert_eq!(r2t_wrong(1 << 20, &x, &r, 0, 8192, 262144), None);
        assert!(r2t_wrong(1 << 20, &x, &r, 0, 0, 0).is_some());
        assert!(r2t_wrong(1 << 20, &x, &r, 0, (1 << 20) - 4096, 8192).unwrap().contains("past"));
        assert!(r2t_wrong(1 << 20, &x, &r, 0, 0, 262145).unwrap().contains("MaxBurstLength"));
        let r1 = R2ts { want_sn: 1, ..r };
        assert!(r2t_wrong(1 << 20, &x, &r1, 0, 0, 4096).unwrap().contains("R2TSN"));
    }

    #[test]
    fn r2ts_ask_each_byte_once_within_max_outstanding_r2t() {
        // The attack: 128 R2Ts for the same 256 KiB, each answered with 512 Data-Outs of 512
        // bytes (65,536 PDUs queued for one command).
        let x = Xfer { max_send_segment: 512, max_r2t: 4, ..x(true, true) };
        let len = 256 << 10;
        let mut r = R2ts::after(512);
        assert_eq!(r2t_wrong(len, &x, &r, 0, 512, len - 512), None);
        r.take(512, len - 512);
        let again = r2t_wrong(len, &x, &r, 1, 512, len - 512).expect("the same range twice");
        assert!(again.contains("already sent"), "{again}");
        // Data sent unsolicited is not asked for again.
        let r0 = R2ts::after(65536);
        assert!(r2t_wrong(len, &x, &r0, 0, 0, 4096).unwrap().contains("already sent"));
        assert_eq!(r2t_wrong(len, &x, &r0, 0, 65536, 4096), None);
        // In order, within MaxOutstandingR2T while earlier answers are still being sent.
        let mut r = R2ts::after(0);
        for i in 0..4 {
            assert_eq!(r2t_wrong(len, &x, &r, i, i * 4096, 4096), None, "R2T {i}");
            r.take(i * 4096, 4096);
        }
        let over = r2t_wrong(len, &x, &r, 4, 4 * 4096, 4096).expect("a fifth outstanding");
        assert!(over.contains("MaxOutstandingR2T"), "{over}");
        r.answered();
        assert_eq!(r2t_wrong(len, &x, &r, 4, 4 * 4096, 4096), None, "one answered: room for one more");
        // However they come, the R2Ts of a command ask for at most its length.
        let mut r = R2ts::after(0);
        let mut asked = 0u64;
        for i in 0..1000u32 {
            let off = (i * 8192) % len;
            if r2t_wrong(len, &x, &r, r.want_sn, off, 8192).is_none() {
                r.take(off, 8192);
                r.answered();
                asked += 8192;
            }
        }
        assert_eq!(asked, u64::from(len));
    }

    #[test]
    fn data_in_comes_in_order() {
        let mut p = ReadProgress::default();
        assert_eq!(p.take(16384, 0, 0, 8192), None);
        p.got = 8192;
        assert!(p.take(16384, 0, 8192, 8192).unwrap().contains("DataSN"), "a repeated DataSN");
        assert!(p.take(16384, 1, 0, 8192).unwrap().contains("offset"), "a repeated offset");
        assert!(p.take(16384, 1, 8192, 8196).unwrap().contains("past"), "longer than asked");
        assert_eq!(p.take(16384, 1, 8192, 8192), None);
        assert_eq!(p.data_sn, 2);
    }
}
