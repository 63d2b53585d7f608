//! The send side of a connection: PDUs framed into [`Out`] entries (the header encoded in
//! place, the data left where it is: pointers into the command's buffers, which outlive the
//! send), queued, and sent by the writer task, all that is queued in one `sendmsg`.

use super::Conn;
use ferrite_iscsi::pdu::{encode, EncodeError, Pdu, PduParams, BHS_LEN, DIGEST_LEN};
use ferrite_target::host::{write_loop, Outgoing};
use smallvec::SmallVec;
use std::rc::Rc;

/// The longest header sent: a BHS and a header digest (no AHS: CDBs are 16 bytes at most).
pub(crate) const HEAD: usize = BHS_LEN + DIGEST_LEN;

/// Zero bytes that pad data to a multiple of 4.
static ZEROS: [u8; 4] = [0; 4];

/// A PDU to send.
pub(crate) struct Out {
    head: [u8; HEAD],
    head_len: u8,
    /// The data, in pieces of memory the PDU's task (or `owned`) keeps until it is sent.
    pieces: SmallVec<[(*const u8, usize); 4]>,
    /// Zero bytes of padding after the data.
    pad: u8,
    /// The data digest, if the PDU has one.
    ddgst: Option<[u8; DIGEST_LEN]>,
    /// The task whose data it carries (its slot), told when the PDU has been sent.
    pub(crate) slot: Option<u16>,
    /// The last Data-Out answering an R2T: once sent, the R2T is no longer outstanding.
    pub(crate) r2t_last: bool,
    /// Data this entry owns (login, logout and NOP-Out PDUs).
    owned: Option<Vec<u8>>,
}

impl Out {
    /// Frames `pdu` under `params` with the data of `pieces`.
    ///
    /// # Safety
    /// Each piece must point to that many readable bytes that stay in place, unchanged,
    /// until the entry has been sent (the writer tells the task, which holds the memory).
    pub(crate) unsafe fn frame(
        params: &PduParams,
        pdu: &Pdu,
        pieces: &[(*const u8, usize)],
    ) -> Result<Out, EncodeError> {
        // SAFETY: the caller's promise.
        let data: SmallVec<[&[u8]; 4]> =
            pieces.iter().map(|&(p, l)| unsafe { std::slice::from_raw_parts(p, l) }).collect();
        let mut o = Out {
            head: [0; HEAD],
            head_len: 0,
            pieces: pieces.iter().copied().collect(),
            pad: 0,
            ddgst: None,
            slot: None,
            r2t_last: false,
            owned: None,
        };
        let f = encode(&mut o.head, params, pdu, &[], &data)?;
        o.head_len = f.head_len as u8;
        o.pad = f.pad_len as u8;
        o.ddgst = f.data_digest;
        Ok(o)
    }

    /// Frames `pdu` with `data` that the entry keeps.
    pub(crate) fn owned(params: &PduParams, pdu: &Pdu, data: Vec<u8>) -> Result<Out, EncodeError> {
        let piece = [(data.as_ptr(), data.len())];
        // SAFETY: the vector's heap memory moves into the entry with it and is not changed.
        let mut o = unsafe { Out::frame(params, pdu, if data.is_empty() { &[] } else { &piece }) }?;
        o.owned = Some(data);
        Ok(o)
    }
}

impl Outgoing for Out {
    fn parts(&self, parts: &mut Vec<(*const u8, usize)>) {
        parts.push((self.head.as_ptr(), usize::from(self.head_len)));
        parts.extend(self.pieces.iter().copied());
        if self.pad > 0 {
            parts.push((ZEROS.as_ptr(), usize::from(self.pad)));
        }
        if let Some(d) = &self.ddgst {
            parts.push((d.as_ptr(), DIGEST_LEN));
        }
    }

    fn slot(&self) -> Option<u16> {
        self.slot.map(|s| if self.r2t_last { s | R2T_LAST } else { s })
    }
}

/// The bit of the tag the writer gives back for a PDU (its slot, below 4096) that marks the
/// last Data-Out of an R2T's answer.
pub(crate) const R2T_LAST: u16 = 0x8000;

/// The tag of the NOP-Out answering a target's ping (no slot: slots are below 4096).
pub(crate) const NOP_ANSWER: u16 = 0x7fff;

/// The pieces of bytes `[off, off + n)` of the scatter list `list`, into `out`.
pub(crate) fn pieces_in(list: &[(*const u8, usize)], off: u32, n: u32, out: &mut SmallVec<[(*const u8, usize); 4]>) {
    out.clear();
    let (off, end) = (off as usize, off as usize + n as usize);
    let mut at = 0usize;
    for &(p, l) in list {
        let (s, e) = (at, at + l);
        at = e;
        let (lo, hi) = (s.max(off), e.min(end));
        if lo < hi {
            // SAFETY: within the piece.
            out.push((unsafe { p.add(lo - s) }, hi - lo));
        }
        if at >= end {
            break;
        }
    }
}

/// The writer task: sends what is queued until the connection closes (the kit's
/// `write_loop`).
pub(crate) async fn writer(c: Rc<Conn>) {
    // SAFETY: heads, tails and owned data are inside the entries; task data points into
    // buffers their tasks keep until `sent` has counted the PDU; the padding is static.
    let res = unsafe { write_loop(&c.core, &c.out, |tag| c.sent(tag)) }.await;
    if let Err(e) = res {
        if !c.core.is_dead() {
            log::info!("iscsi host connection {} to {}: send failed: {e}", c.core.id, c.core.peer);
        }
        c.close();
    }
    c.out.borrow_mut().clear();
    c.task_done();
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_iscsi::pdu::{decode_whole, DataOut, Role};

    fn wire(o: &Out) -> Vec<u8> {
        let mut parts = Vec::new();
        o.parts(&mut parts);
        // SAFETY: the parts point into `o` and the test's data, alive here.
        parts.iter().flat_map(|&(p, l)| unsafe { std::slice::from_raw_parts(p, l) }.to_vec()).collect()
    }

    #[test]
    fn framed_pdus_decode_with_padding_and_digests() {
        let pdu = Pdu::DataOut(DataOut {
            final_: true,
            lun: 0,
            itt: 5,
            ttt: 9,
            exp_stat_sn: 1,
            data_sn: 0,
            buffer_offset: 0,
        });
        let a = [1u8, 2, 3];
        let b = [4u8, 5, 6, 7, 8, 9, 10];
        for (hd, dd) in [(false, false), (true, true), (false, true)] {
            let params = PduParams { header_digest: hd, data_digest: dd, max_data_segment: 8192 };
            // SAFETY: the arrays outlive the entry.
            let o = unsafe { Out::frame(&params, &pdu, &[(a.as_ptr(), 3), (b.as_ptr(), 7)]) }.unwrap();
            let bytes = wire(&o);
            let d = decode_whole(Role::Target, &params, &bytes).unwrap().unwrap();
            assert_eq!(d.data, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
            assert_eq!(d.len, bytes.len(), "padding and digests sent ({hd} {dd})");
            assert!(!matches!(d.data_digest, ferrite_iscsi::pdu::DigestCheck::Mismatch { .. }));
        }
    }

    #[test]
    fn pieces_cover_a_range_of_a_scatter_list() {
        let (a, b, c) = ([0u8; 10], [0u8; 20], [0u8; 5]);
        let list = [(a.as_ptr(), 10), (b.as_ptr(), 20), (c.as_ptr(), 5)];
        let mut out = SmallVec::new();
        pieces_in(&list, 5, 20, &mut out);
        // SAFETY: pointer arithmetic within the arrays, compared only.
        assert_eq!(out.as_slice(), &[(unsafe { a.as_ptr().add(5) }, 5), (b.as_ptr(), 15)]);
        pieces_in(&list, 30, 5, &mut out);
        assert_eq!(out.as_slice(), &[(c.as_ptr(), 5)]);
        pieces_in(&list, 0, 35, &mut out);
        assert_eq!(out.len(), 3);
    }
}
