//! A command's answer: its data-in as Data-In PDUs of at most the initiator's
//! MaxRecvDataSegmentLength, in sequences of at most MaxBurstLength (F on each sequence's last
//! PDU), DataSN counting from 0; then its status, in the last Data-In when it has no sense
//! data (phase collapse, RFC 7143 section 11.7.4), else in a SCSI Response with the sense data,
//! residuals (U or O and the count), StatSN, and ExpDataSN. The window opens as the answer is
//! queued, so it carries the new MaxCmdSN. Data-In go out from the SCSI layer's buffers (the
//! bdev's, lent memory for zero-copy reads), never copied.

use super::conn::Conn;
use super::out::Payload;
use ferrite_iscsi::pdu::{scsi_response, DataIn, Pdu, ScsiResponse, RESERVED_TAG};
use ferrite_scsi::{Residual, Response};

/// The U/O flags and the count of a residual.
fn residual(r: Residual) -> (bool, bool, u32) {
    match r {
        Residual::None => (false, false, 0),
        Residual::Under(n) => (true, false, n),
        Residual::Over(n) => (false, true, n),
    }
}

/// The command in `slot` ended with `resp`: its slot is freed and its answer queued (none for
/// a task a task management function aborted, nor on a dead connection).
pub(crate) fn respond(c: &Conn, slot: u32, resp: Response) {
    let (itt, immediate, mut sn) = {
        let cmds = c.cmds.borrow();
        let x = &cmds[slot as usize];
        (x.itt, x.immediate, x.sn)
    };
    super::task::release(c, slot);
    c.finished(immediate);
    if resp.aborted || c.is_dead() {
        return;
    }
    let good = resp.status == ferrite_scsi::sense::STATUS_GOOD;
    let data_len = if good { resp.data_len.min(resp.data.iter().map(|b| b.len() as u32).sum()) } else { 0 };
    let (under, over, count) = residual(resp.residual);
    let collapse = good && resp.sense.is_empty() && data_len > 0;
    let (burst, seg) = match c.session() {
        Some(s) => (s.params.max_burst_length.max(512), c.tx.get().max_data_segment.max(512)),
        None => return,
    };
    let seq = &c.seq;
    c.queue(|q, tx| {
        if data_len > 0 {
            q.begin(Payload::Bufs(resp.data));
            let mut off = 0u32;
            while off < data_len {
                let seq_end = (off / burst + 1).saturating_mul(burst).min(data_len);
                let len = seg.min(seq_end - off);
                let last = off + len == data_len;
                let status = last && collapse;
                let pdu = Pdu::DataIn(DataIn {
                    final_: off + len == seq_end,
                    acknowledge: false,
                    overflow: status && over,
                    underflow: status && under,
                    status_present: status,
                    status: if status { resp.status } else { 0 },
                    lun: 0,
                    itt,
                    ttt: RESERVED_TAG,
                    stat_sn: if status { seq.take_stat_sn() } else { 0 },
                    exp_cmd_sn: seq.exp_cmd_sn(),
                    max_cmd_sn: seq.max_cmd_sn(),
                    data_sn: sn,
                    buffer_offset: off,
                    residual_count: if status { count } else { 0 },
                });
                q.pdu(tx, &pdu, off, len)?;
                sn = sn.wrapping_add(1);
                off += len;
            }
            if collapse {
                return Ok(());
            }
        }
        let pdu = Pdu::ScsiResponse(ScsiResponse {
            bidi_overflow: false,
            bidi_underflow: false,
            overflow: over,
            underflow: under,
            response: scsi_response::COMPLETED,
            status: resp.status,
            itt,
            snack_tag: 0,
            stat_sn: seq.take_stat_sn(),
            exp_cmd_sn: seq.exp_cmd_sn(),
            max_cmd_sn: seq.max_cmd_sn(),
            exp_data_sn: sn,
            bidi_read_residual_count: 0,
            residual_count: count,
        });
        let sense = resp.sense.as_slice();
        if sense.is_empty() {
            q.begin(Payload::None);
            q.pdu(tx, &pdu, 0, 0)
        } else {
            let payload = Payload::sense(sense);
            let len = sense.len().min(super::out::INLINE_LEN - 2) as u32 + 2;
            q.begin(payload);
            q.pdu(tx, &pdu, 0, len)
        }
    });
}
