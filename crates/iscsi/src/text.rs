//! Text Request/Response exchanges in the full feature phase at a target (RFC 7143 sections
//! 6.2, 11.10 and 11.11): joining requests continued with the C bit, splitting answers longer
//! than the initiator's MaxRecvDataSegmentLength over several responses, and the Target
//! Transfer Tags that tie them together.
//!
//! - A request with C set is answered with an empty response (F=0, a TTT) and its text kept.
//! - The whole text goes to the caller's `answer` function (negotiation, SendTargets), whose
//!   text is sent in pieces of at most `max_send` bytes: every piece but the last has C set
//!   and a TTT; the initiator asks for the next piece with an empty request carrying it.
//! - The last response has F set (and TTT 0xffffffff) if the request had F set.
//! - A request with TTT 0xffffffff starts a new exchange, dropping an unfinished one
//!   (RFC 7143 section 11.10.4); one with another TTT must carry the current one and ITT.
//!
//! StatSN, ExpCmdSN and MaxCmdSN are the session's: the caller fills them in the responses.

use std::fmt;

use crate::keys::{split_text, KeyValue, TextAssembler, TextError, TextWriter};
use crate::negotiate::NegotiationError;
use crate::pdu::{RejectReason, TextRequest, TextResponse, RESERVED_TAG};

/// A Text Response to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TextReply {
    /// The header (StatSN, ExpCmdSN and MaxCmdSN to be filled by the caller).
    pub response: TextResponse,
    /// Its data.
    pub data: Vec<u8>,
}

/// A Text Request the exchange cannot take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TextExchangeError {
    /// A TTT or ITT that does not belong to the exchange, or data in a request for the rest
    /// of a response: answer with a Reject (protocol error).
    Protocol(&'static str),
    /// The text is malformed or too long.
    Text(TextError),
    /// The negotiation failed.
    Negotiation(NegotiationError),
}

impl TextExchangeError {
    /// The Reject reason to answer with.
    pub fn reject_reason(&self) -> RejectReason {
        RejectReason::ProtocolError
    }
}

impl fmt::Display for TextExchangeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TextExchangeError::Protocol(what) => write!(f, "text exchange: {what}"),
            TextExchangeError::Text(e) => write!(f, "text exchange: {e}"),
            TextExchangeError::Negotiation(e) => write!(f, "text exchange: {e}"),
        }
    }
}

impl std::error::Error for TextExchangeError {}

/// One connection's text exchanges at a target.
#[derive(Debug, Clone, Default)]
pub struct TargetText {
    text: TextAssembler,
    itt: Option<u32>,
    ttt: u32,
    pending: Vec<u8>,
    sent: usize,
}

impl TargetText {
    /// No exchange under way.
    pub fn new() -> TargetText {
        TargetText::default()
    }

    /// Whether a response is still being sent in pieces.
    pub fn is_sending(&self) -> bool {
        self.sent < self.pending.len()
    }

    /// Answers one Text Request. `ttt` is a tag for the responses that need one (unique on
    /// the connection, not 0xffffffff); `max_send` the initiator's MaxRecvDataSegmentLength;
    /// `answer` writes the answer to a whole request text.
    pub fn on_request(
        &mut self,
        req: &TextRequest,
        data: &[u8],
        ttt: u32,
        max_send: u32,
        answer: impl FnOnce(&[KeyValue], &mut TextWriter) -> Result<(), NegotiationError>,
    ) -> Result<TextReply, TextExchangeError> {
        debug_assert!(ttt != RESERVED_TAG && max_send > 0);
        if req.ttt == RESERVED_TAG {
            *self = TargetText::new();
            self.itt = Some(req.itt);
        } else if req.ttt != self.ttt || self.itt != Some(req.itt) {
            return Err(TextExchangeError::Protocol("TTT or ITT not of the exchange"));
        } else if self.is_sending() {
            if !data.is_empty() {
                return Err(TextExchangeError::Protocol("data in a request for the rest of a response"));
            }
            return Ok(self.next_piece(req, max_send));
        }
        self.ttt = ttt;
        let pairs = match self.text.push(data, req.continue_).map_err(TextExchangeError::Text)? {
            None => return Ok(self.reply(req, false, false, Vec::new())),
            Some(p) => p,
        };
        let mut out = TextWriter::new();
        answer(&pairs, &mut out).map_err(TextExchangeError::Negotiation)?;
        self.pending = out.into_bytes();
        self.sent = 0;
        Ok(self.next_piece(req, max_send))
    }

    fn next_piece(&mut self, req: &TextRequest, max_send: u32) -> TextReply {
        let piece = split_text(&self.pending[self.sent..], max_send as usize).next().unwrap_or(&[]).to_vec();
        self.sent += piece.len();
        let more = self.is_sending();
        if !more {
            self.pending.clear();
            self.sent = 0;
        }
        self.reply(req, !more && req.final_, more, piece)
    }

    fn reply(&self, req: &TextRequest, final_: bool, continue_: bool, data: Vec<u8>) -> TextReply {
        TextReply {
            response: TextResponse {
                final_,
                continue_,
                lun: req.lun,
                itt: req.itt,
                ttt: if final_ { RESERVED_TAG } else { self.ttt },
                stat_sn: 0,
                exp_cmd_sn: 0,
                max_cmd_sn: 0,
            },
            data,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discovery::{send_targets, Portal, TargetRecord};
    use crate::keys::parse_text;
    use crate::negotiate::{target::Phase, SessionType, TargetNegotiator, TargetOptions};

    fn req(ttt: u32, final_: bool, continue_: bool) -> TextRequest {
        TextRequest { immediate: true, final_, continue_, lun: 0, itt: 9, ttt, cmd_sn: 1, exp_stat_sn: 1 }
    }

    fn records(n: usize) -> Vec<TargetRecord> {
        (0..n)
            .map(|i| TargetRecord {
                name: format!("iqn.2016-06.io.spdk:disk{i}"),
                portals: vec![Portal { host: "192.168.100.100".into(), port: 3260, group_tag: 1 }],
            })
            .collect()
    }

    /// A discovery session's SendTargets=All whose answer spans several responses, driven as
    /// a target engine would: the negotiator answers keys and hands SendTargets back.
    #[test]
    fn send_targets_in_pieces() {
        let targets = records(40);
        let mut neg = TargetNegotiator::new(TargetOptions::default(), true);
        let mut ex = TargetText::new();
        let mut answer = |pairs: &[KeyValue], out: &mut TextWriter| {
            let special = neg.respond(Phase::FullFeature, pairs, out)?;
            if let Some(v) = special.send_targets {
                send_targets(&v, SessionType::Discovery, None, &targets, out);
            }
            Ok(())
        };
        let mut all = Vec::new();
        let r = ex.on_request(&req(RESERVED_TAG, true, false), b"SendTargets=All\0", 5, 512, &mut answer).unwrap();
        assert!(r.response.continue_ && !r.response.final_ && r.response.ttt == 5);
        assert_eq!(r.data.len(), 512);
        all.extend_from_slice(&r.data);
        let mut n = 1;
        loop {
            let r = ex
                .on_request(&req(5, true, false), b"", 5, 512, |_: &[KeyValue], _: &mut TextWriter| unreachable!())
                .unwrap();
            all.extend_from_slice(&r.data);
            n += 1;
            if r.response.final_ {
                assert_eq!(r.response.ttt, RESERVED_TAG);
                assert!(!r.response.continue_);
                break;
            }
            assert!(r.response.continue_);
        }
        assert!(n > 2);
        let pairs = parse_text(&all).unwrap();
        assert_eq!(pairs.len(), 80);
        assert_eq!(pairs[79].value, "192.168.100.100:3260,1");
        assert!(!ex.is_sending());
    }

    #[test]
    fn continued_requests_and_protocol_errors() {
        let mut ex = TargetText::new();
        let echo = |pairs: &[KeyValue], out: &mut TextWriter| {
            for p in pairs {
                out.push(&p.key, "NotUnderstood");
            }
            Ok(())
        };
        let r = ex.on_request(&req(RESERVED_TAG, false, true), b"X-a=", 3, 8192, echo).unwrap();
        assert!(r.data.is_empty() && !r.response.final_ && r.response.ttt == 3);
        let r = ex.on_request(&req(3, true, false), b"1\0", 3, 8192, echo).unwrap();
        assert_eq!(r.data, b"X-a=NotUnderstood\0");
        assert!(r.response.final_);
        // A TTT the exchange did not give.
        let e = ex.on_request(&req(77, true, false), b"", 3, 8192, echo).unwrap_err();
        assert_eq!(e.reject_reason(), RejectReason::ProtocolError);
        // A new exchange replaces an unfinished one.
        let r = ex.on_request(&req(RESERVED_TAG, true, false), b"X-b=1\0", 4, 8, echo).unwrap();
        assert!(r.response.continue_);
        let e = ex.on_request(&req(4, true, false), b"X-c=1\0", 4, 8, echo).unwrap_err();
        assert!(matches!(e, TextExchangeError::Protocol(_)));
        let r = ex.on_request(&req(RESERVED_TAG, true, false), b"X-d=1\0", 6, 8192, echo).unwrap();
        assert_eq!(r.data, b"X-d=NotUnderstood\0");
    }
}
