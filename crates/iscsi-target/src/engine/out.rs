//! The send side of a connection: PDUs queued as they are made (each head encoded at once,
//! its data left where it is: the bdev's buffers for a read, lent memory for a zero-copy one),
//! and the writer task that sends everything queued in one `sendmsg`.
//!
//! The queue is two vectors (items and their heads) that the writer swaps with an empty pair
//! of its own, so that steady state allocates nothing: a read's Data-In PDUs are heads over
//! ranges of one payload.

use super::conn::Conn;
use ferrite_bdev::IoBufs;
use ferrite_iscsi::pdu::{encode, EncodeError, Pdu, PduParams, BHS_LEN, DIGEST_LEN};
use ferrite_reactor::net::SendCache;
use smallvec::SmallVec;
use std::future::poll_fn;
use std::rc::Rc;
use std::task::Poll;
use std::time::Duration;

/// Longest head the target sends: a BHS and its digest (the target sends no AHS).
pub(crate) const HEAD_LEN: usize = BHS_LEN + DIGEST_LEN;
/// Longest payload kept inline (sense data with its length, a small NOP-In echo).
pub(crate) const INLINE_LEN: usize = 64;

/// Zeroes for padding.
static ZEROES: [u8; 4] = [0; 4];

/// One PDU's head and where its data lies in its item's payload.
pub(crate) struct Head {
    bytes: [u8; HEAD_LEN],
    len: u8,
    data_at: u32,
    data_len: u32,
    pad: u8,
    ddgst: Option<[u8; DIGEST_LEN]>,
}

/// The data an item's PDUs carry.
#[derive(Default)]
pub(crate) enum Payload {
    /// None.
    #[default]
    None,
    /// A command's data-in buffers (the bdev's, or lent memory).
    Bufs(IoBufs),
    /// A few bytes inline (sense data with its length).
    Inline([u8; INLINE_LEN], u8),
    /// Text (login, text, NOP-In echoes, Reject's header copy).
    Vec(Vec<u8>),
}

impl Payload {
    /// Sense data with its 2-byte length (a SCSI Response's data segment).
    pub(crate) fn sense(sense: &[u8]) -> Payload {
        let n = sense.len().min(INLINE_LEN - 2);
        let mut b = [0u8; INLINE_LEN];
        b[..2].copy_from_slice(&(n as u16).to_be_bytes());
        b[2..2 + n].copy_from_slice(&sense[..n]);
        Payload::Inline(b, (n + 2) as u8)
    }

    /// The bytes `at..at + len`, as slices of the payload's pieces.
    fn slices(&self, at: usize, len: usize) -> SmallVec<[&[u8]; 4]> {
        let mut out = SmallVec::new();
        if len == 0 {
            return out;
        }
        match self {
            Payload::None => debug_assert!(false, "data range over no payload"),
            Payload::Inline(b, n) => out.push(&b[at..(at + len).min(usize::from(*n))]),
            Payload::Vec(v) => out.push(&v[at..at + len]),
            Payload::Bufs(bufs) => {
                let (mut skip, mut left) = (at, len);
                for b in bufs {
                    if left == 0 {
                        break;
                    }
                    if skip >= b.len() {
                        skip -= b.len();
                        continue;
                    }
                    let take = (b.len() - skip).min(left);
                    out.push(&b[skip..skip + take]);
                    left -= take;
                    skip = 0;
                }
                debug_assert_eq!(left, 0, "data range past the payload");
            }
        }
        out
    }
}

/// One queued group of PDUs sharing a payload (a read's Data-In and its response, say).
struct Item {
    heads: std::ops::Range<u32>,
    payload: Payload,
}

/// PDUs waiting to be sent.
#[derive(Default)]
pub(crate) struct OutQueue {
    items: Vec<Item>,
    heads: Vec<Head>,
    bytes: usize,
}

impl OutQueue {
    /// True if nothing is queued.
    pub(crate) fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Bytes queued.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    fn clear(&mut self) {
        self.items.clear();
        self.heads.clear();
        self.bytes = 0;
    }

    /// Starts an item whose PDUs carry data from `payload`.
    pub(crate) fn begin(&mut self, payload: Payload) {
        let at = self.heads.len() as u32;
        self.items.push(Item { heads: at..at, payload });
    }

    /// Adds PDU `pdu` to the last item, its data bytes `at..at + len` of the item's payload,
    /// framed under `params` (the digests; the peer's data limit).
    pub(crate) fn pdu(&mut self, params: &PduParams, pdu: &Pdu, at: u32, len: u32) -> Result<(), EncodeError> {
        let item = self.items.last_mut().expect("begin() before pdu()");
        let data = item.payload.slices(at as usize, len as usize);
        let mut head = Head { bytes: [0; HEAD_LEN], len: 0, data_at: at, data_len: len, pad: 0, ddgst: None };
        let f = encode(&mut head.bytes, params, pdu, &[], &data)?;
        debug_assert_eq!(f.data_len, len);
        head.len = f.head_len as u8;
        head.pad = f.pad_len as u8;
        head.ddgst = f.data_digest;
        self.bytes += f.wire_len();
        self.heads.push(head);
        item.heads.end += 1;
        Ok(())
    }

    /// Queues one PDU with `data` (copied into the item when small).
    pub(crate) fn single(&mut self, params: &PduParams, pdu: &Pdu, data: &[u8]) -> Result<(), EncodeError> {
        let payload = if data.is_empty() {
            Payload::None
        } else if data.len() <= INLINE_LEN {
            let mut b = [0u8; INLINE_LEN];
            b[..data.len()].copy_from_slice(data);
            Payload::Inline(b, data.len() as u8)
        } else {
            Payload::Vec(data.to_vec())
        };
        self.begin(payload);
        let r = self.pdu(params, pdu, 0, data.len() as u32);
        if r.is_err() {
            self.items.pop();
        }
        r
    }
}

/// Sends everything queued, batch by batch, until the connection closes and drains.
pub(crate) async fn writer(c: Rc<Conn>) {
    let mut batch = OutQueue::default();
    let mut parts: Vec<(*const u8, usize)> = Vec::new();
    let cache = SendCache::default();
    loop {
        let done = poll_fn(|cx| {
            if !c.out.borrow().is_empty() {
                return Poll::Ready(false);
            }
            if c.is_closing() && (c.drained() || c.is_dead()) {
                return Poll::Ready(true);
            }
            c.park_writer(cx);
            Poll::Pending
        })
        .await;
        if done {
            return;
        }
        std::mem::swap(&mut *c.out.borrow_mut(), &mut batch);
        let bytes = batch.bytes;
        if c.is_dead() {
            batch.clear();
            continue;
        }
        parts.clear();
        for item in &batch.items {
            for h in &batch.heads[item.heads.start as usize..item.heads.end as usize] {
                parts.push((h.bytes.as_ptr(), usize::from(h.len)));
                for s in item.payload.slices(h.data_at as usize, h.data_len as usize) {
                    parts.push((s.as_ptr(), s.len()));
                }
                if h.pad > 0 {
                    parts.push((ZEROES.as_ptr(), usize::from(h.pad)));
                }
                if let Some(d) = &h.ddgst {
                    parts.push((d.as_ptr(), DIGEST_LEN));
                }
            }
            if let Payload::Bufs(bufs) = &item.payload {
                for b in bufs {
                    ferrite_reactor::buf::warm_lent(b);
                }
            }
        }
        c.sending.begin(bytes);
        // SAFETY: every part points into `batch` (head arrays and inline payloads inside its
        // vectors' heap buffers, data in buffers it owns) or into a static, and send_parts
        // keeps `batch` until the send completes.
        let (res, b) = unsafe { c.sock.send_parts(&cache, &parts, batch).await };
        c.sending.end();
        batch = b;
        batch.clear();
        c.sent(bytes);
        if let Err(e) = res {
            if !c.is_closing() {
                log::info!("iscsi connection {}: send failed: {e}", c.id);
            }
            c.close();
        }
    }
}

/// How long the writer waits for the socket before the watchdog calls the initiator stalled:
/// [`super::SEND_BASE_TIME`] plus this per MiB queued.
pub(crate) const SEND_PER_MIB: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_iscsi::pdu::{decode_whole, NopIn, Role};
    use ferrite_reactor::IoBuf;

    #[test]
    fn ranges_of_a_payload_span_its_buffers() {
        let mut a = IoBuf::heap(4);
        a.copy_from_slice(b"abcd");
        let mut b = IoBuf::heap(4);
        b.copy_from_slice(b"efgh");
        let p = Payload::Bufs([a, b].into_iter().collect());
        let s = p.slices(2, 4);
        assert_eq!(s.len(), 2);
        assert_eq!((s[0], s[1]), (&b"cd"[..], &b"ef"[..]));
        assert_eq!(p.slices(4, 4)[..], [&b"efgh"[..]]);
        assert!(p.slices(0, 0).is_empty());
        let sense = Payload::sense(&[0x70, 0, 5]);
        assert_eq!(sense.slices(0, 5)[0], &[0, 3, 0x70, 0, 5]);
    }

    #[test]
    fn queued_pdus_encode_with_their_digests() {
        let params = PduParams { header_digest: true, data_digest: true, max_data_segment: 8192 };
        let mut q = OutQueue::default();
        let nop = Pdu::NopIn(NopIn { lun: 0, itt: 1, ttt: u32::MAX, stat_sn: 3, exp_cmd_sn: 4, max_cmd_sn: 5 });
        q.single(&params, &nop, b"hello").unwrap();
        let item = &q.items[0];
        let h = &q.heads[item.heads.start as usize];
        let mut wire = h.bytes[..usize::from(h.len)].to_vec();
        for s in item.payload.slices(0, 5) {
            wire.extend_from_slice(s);
        }
        wire.extend_from_slice(&ZEROES[..usize::from(h.pad)]);
        wire.extend_from_slice(&h.ddgst.unwrap());
        assert_eq!(q.bytes(), wire.len());
        let d = decode_whole(Role::Initiator, &params, &wire).unwrap().unwrap();
        assert_eq!(d.data, b"hello");
        assert_eq!(d.data_digest, ferrite_iscsi::pdu::DigestCheck::Ok);
    }
}
