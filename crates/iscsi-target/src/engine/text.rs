//! Text Requests in the full feature phase: key negotiation (`TargetNegotiator` in its full
//! feature phase) and SendTargets, through `ferrite_iscsi::text::TargetText` (continued
//! requests, long answers split at the initiator's MaxRecvDataSegmentLength under a TTT).
//! SendTargets lists what the model says this initiator may reach from its address, with a
//! wildcard portal named by the address the initiator connected to (as SPDK does).

use super::conn::Conn;
use ferrite_iscsi::discovery::{self, Portal, TargetRecord};
use ferrite_iscsi::keys::{KeyValue, TextWriter};
use ferrite_iscsi::negotiate::target::Phase;
use ferrite_iscsi::negotiate::{NegotiationError, TargetNegotiator};
use ferrite_iscsi::pdu::{Pdu, RejectReason, TextRequest, BHS_LEN};
use ferrite_iscsi::text::TargetText;

/// A connection's text exchanges.
pub(crate) struct TextState {
    exchange: TargetText,
    negotiator: TargetNegotiator,
}

impl TextState {
    /// No exchange under way; keys negotiated by `negotiator`.
    pub(crate) fn new(negotiator: TargetNegotiator) -> TextState {
        TextState { exchange: TargetText::new(), negotiator }
    }
}

/// The SendTargets answer to `value` for connection `c`.
fn send_targets(c: &Conn, value: &str, out: &mut TextWriter) {
    let Some(sess) = c.session() else { return };
    let Some(ip) = c.peer_ip else { return };
    let local_host = c.local.rsplit_once(':').map_or(c.local.as_str(), |(h, _)| h).to_string();
    let records: Vec<TargetRecord> = crate::send_targets(&sess.initiator, ip, None)
        .into_iter()
        .map(|e| TargetRecord {
            name: e.name,
            portals: e
                .addresses
                .iter()
                .filter_map(|a| {
                    let port = crate::portal::port_number(&a.portal.port)?;
                    let host = if a.portal.is_wildcard() { local_host.clone() } else { a.portal.host.clone() };
                    Some(Portal { host, port, group_tag: a.tag as u16 })
                })
                .collect(),
        })
        .collect();
    let current = sess.target.as_ref().map(|t| t.name.as_str());
    discovery::send_targets(value, sess.kind, current, &records, out);
}

/// A Text Request (its CmdSN accepted) with its whole data.
pub(crate) fn on_request(c: &Conn, t: &TextRequest, data: &[u8], bhs: &[u8; BHS_LEN]) {
    let ttt = c.next_ttt();
    let max_send = c.tx.get().max_data_segment.max(512);
    let mut guard = c.text.borrow_mut();
    let Some(st) = guard.as_mut() else { return };
    let TextState { exchange, negotiator } = st;
    let answer = |pairs: &[KeyValue], out: &mut TextWriter| -> Result<(), NegotiationError> {
        let special = negotiator.respond(Phase::FullFeature, pairs, out)?;
        if let Some(v) = special.send_targets {
            send_targets(c, &v, out);
        }
        Ok(())
    };
    let res = exchange.on_request(t, data, ttt, max_send, answer);
    let peer_mrdsl = negotiator.peer_max_recv_data_segment_length();
    drop(guard);
    c.finished(t.immediate);
    match res {
        Ok(mut reply) => {
            if let Some(m) = peer_mrdsl {
                // A MaxRecvDataSegmentLength declared again holds from now on.
                let mut tx = c.tx.get();
                tx.max_data_segment = m;
                c.tx.set(tx);
            }
            reply.response.stat_sn = c.seq.take_stat_sn();
            reply.response.exp_cmd_sn = c.seq.exp_cmd_sn();
            reply.response.max_cmd_sn = c.seq.max_cmd_sn();
            c.send_pdu(&Pdu::TextResponse(reply.response), &reply.data);
        }
        Err(e) => {
            c.reject(RejectReason::ProtocolError, bhs, &e.to_string());
        }
    }
}
