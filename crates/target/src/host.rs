//! What initiators share (the NVMe/TCP host, the iSCSI initiator) around their commands: who
//! waits for a command ([`Owner`]), its phase with the rule that it ends only once the PDUs
//! carrying its data have been sent ([`Flight`]), the writer task that sends what is queued
//! ([`write_loop`]), a read's data received straight into the command's buffers ([`place`]),
//! and why a reader stopped ([`Stop`]).

use crate::conn::ConnCore;
use crate::phase::{transition, Phase};
use crate::rx::Rx;
use crate::slots::SlotTable;
use ferrite_bdev::BdevIo;
use ferrite_reactor::net::SendCache;
use ferrite_reactor::{oneshot, IoBuf};
use std::cell::RefCell;
use std::future::{poll_fn, Future};
use std::task::Poll;
use std::time::{Duration, Instant};

/// Where a host's command stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum HostPhase {
    /// The slot is free.
    #[default]
    Free,
    /// Sent (or queued to be): waiting for its answer (a completion, a status).
    Sent,
    /// Its answer came while PDUs carrying its data were still being sent: it ends when that
    /// send is done (its buffers are the kernel's until then).
    Answered,
}

impl Phase for HostPhase {
    fn may_become(self, to: HostPhase) -> bool {
        use HostPhase::*;
        matches!((self, to), (Free, Sent) | (Sent, Answered | Free) | (Answered, Free))
    }
}

/// Who waits for a host's command (`R`: the reply a caller of the connection's own gets).
pub enum Owner<R> {
    /// A bdev request: data goes to or from its buffers; it completes with the command.
    Bdev(BdevIo),
    /// A caller of the connection's own (admin and Fabrics commands, the attach's SCSI
    /// commands), with the data the command sends or the buffer it reads into.
    Wait {
        /// Where the reply goes.
        tx: oneshot::Sender<Result<R, String>>,
        /// Data to send (host to peer).
        out: Option<IoBuf>,
        /// Data received (peer to host).
        inb: Option<IoBuf>,
    },
}

impl<R> Owner<R> {
    /// The buffers a read's data goes to, a scatter list (None: a caller's command without a
    /// buffer to read into).
    pub fn read_bufs(&mut self) -> Option<&mut [IoBuf]> {
        match self {
            Owner::Bdev(io) => Some(&mut io.req.bufs[..]),
            Owner::Wait { inb: Some(b), .. } => Some(std::slice::from_mut(b)),
            Owner::Wait { inb: None, .. } => None,
        }
    }
}

/// A host command's phase, how many PDUs carrying its data are queued or being sent, and its
/// answer while it waits for them (`E`: how a command ends, in its protocol's terms). Every
/// change goes through the kit's [`transition`].
pub struct Flight<E> {
    phase: HostPhase,
    /// PDUs carrying its data queued or being sent (u32 and checked: were it to wrap, the
    /// command would end while the kernel still reads its buffers).
    in_send: u32,
    done: Option<E>,
}

impl<E> Default for Flight<E> {
    fn default() -> Self {
        Flight { phase: HostPhase::Free, in_send: 0, done: None }
    }
}

impl<E> Flight<E> {
    /// Where the command stands.
    #[inline]
    pub fn phase(&self) -> HostPhase {
        self.phase
    }

    /// True while it is sent and waits for its answer (what a PDU of the peer may name).
    #[inline]
    pub fn is_sent(&self) -> bool {
        self.phase == HostPhase::Sent
    }

    /// The slot's next command is sent (or queued to be): command `slot` of connection `conn`.
    #[inline]
    pub fn start(&mut self, conn: u64, slot: u32) {
        debug_assert!(self.in_send == 0 && self.done.is_none(), "a free slot holds nothing");
        transition(&mut self.phase, HostPhase::Sent, conn, slot);
    }

    /// A PDU carrying its data was queued: the command does not end before the writer has sent
    /// it ([`Flight::sent`]). False if the count is full (the PDU must not be queued: the
    /// caller drops the connection, the peer asked for far more data than the command has).
    #[inline]
    #[must_use]
    pub fn queued(&mut self) -> bool {
        debug_assert!(self.phase == HostPhase::Sent, "data queued for a command that is not outstanding");
        match self.in_send.checked_add(1) {
            Some(n) => {
                self.in_send = n;
                true
            }
            None => {
                debug_assert!(false, "a command's in-send count overflows");
                false
            }
        }
    }

    /// PDUs carrying its data queued or being sent.
    #[inline]
    pub fn in_send(&self) -> u32 {
        self.in_send
    }

    /// A PDU carrying its data has been sent. Returns its answer if that was the last one and
    /// the answer came meanwhile: the command ends now (the caller ends it with that answer,
    /// through [`Flight::answer`]).
    #[inline]
    pub fn sent(&mut self) -> Option<E> {
        debug_assert!(self.in_send > 0, "a send counted that was not queued");
        self.in_send = self.in_send.saturating_sub(1);
        if self.in_send == 0 && self.phase == HostPhase::Answered {
            self.done.take()
        } else {
            None
        }
    }

    /// Its answer `end` came (or the end its connection made up). Some(`end`) if the command
    /// ends now (phase Free: the caller releases its slot and completes it); None while PDUs
    /// carrying its data are still being sent (phase Answered: `end` is kept until
    /// [`Flight::sent`] gives it back).
    #[inline]
    pub fn answer(&mut self, end: E, conn: u64, slot: u32) -> Option<E> {
        debug_assert!(self.phase != HostPhase::Free, "connection {conn} slot {slot}: an answer for a free slot");
        if self.in_send > 0 {
            transition(&mut self.phase, HostPhase::Answered, conn, slot);
            self.done = Some(end);
            return None;
        }
        transition(&mut self.phase, HostPhase::Free, conn, slot);
        self.done = None;
        Some(end)
    }

    /// The connection's tasks have stopped: no send of its data will be counted any more, and
    /// its buffers are no longer the kernel's (an answer now ends it at once).
    #[inline]
    pub fn sends_lost(&mut self) {
        self.in_send = 0;
    }

    /// Ends the command whatever its sends and its answer (the connection's tasks have stopped:
    /// nothing is being sent any more): phase Free, a kept answer dropped.
    pub fn end(&mut self, conn: u64, slot: u32) {
        self.sends_lost();
        self.done = None;
        transition(&mut self.phase, HostPhase::Free, conn, slot);
    }
}

/// Why a host connection's reader stopped.
#[derive(Debug)]
pub enum Stop {
    /// The connection closed or failed under it (nothing the peer sent was wrong).
    Closed(String),
    /// The peer broke the protocol: what it did wrong.
    Violation(String),
}

impl From<String> for Stop {
    fn from(e: String) -> Stop {
        Stop::Closed(e)
    }
}

/// A PDU queued for a host connection's writer ([`write_loop`]).
pub trait Outgoing {
    /// Appends the PDU's bytes to `parts`, as pieces in order.
    fn parts(&self, parts: &mut Vec<(*const u8, usize)>);
    /// The slot of the command whose data it carries, if any: told once it has been sent.
    fn slot(&self) -> Option<u16>;
}

/// A host connection's writer: waits for PDUs in `queue`, sends all that is queued in one
/// `sendmsg`, then tells `sent` the slot of each PDU that carried a command's data, until the
/// connection is closed for good (Ok) or a send fails (Err, after `sent` heard of its batch).
/// Its batch and parts vectors are reused: a send allocates nothing.
///
/// # Safety
/// Each queued entry's pieces must point to readable bytes that stay in place, unchanged, until
/// `sent` has been told its slot (bytes inside the entry itself do: a batch's heap memory does
/// not move while it is sent).
pub async unsafe fn write_loop<O: Outgoing + 'static>(
    core: &ConnCore,
    queue: &RefCell<Vec<O>>,
    mut sent: impl FnMut(u16),
) -> std::io::Result<()> {
    let mut batch: Vec<O> = Vec::new();
    let mut parts: Vec<(*const u8, usize)> = Vec::new();
    let cache = SendCache::default();
    loop {
        let closed = poll_fn(|cx| {
            if core.is_dead() {
                return Poll::Ready(true);
            }
            if !queue.borrow().is_empty() {
                return Poll::Ready(false);
            }
            core.park_writer(cx);
            Poll::Pending
        })
        .await;
        if closed {
            return Ok(());
        }
        std::mem::swap(&mut *queue.borrow_mut(), &mut batch);
        parts.clear();
        for o in &batch {
            o.parts(&mut parts);
        }
        // SAFETY: the caller's promise: heads inside `batch`, which the send keeps; data in
        // buffers their commands keep until `sent` below.
        let (res, b) = unsafe { core.sock.send_parts(&cache, &parts, batch).await };
        batch = b;
        for o in batch.drain(..) {
            if let Some(slot) = o.slot() {
                sent(slot);
            }
        }
        res?;
    }
}

/// A host command whose read data is received straight into its buffers ([`place`]).
pub trait Reads {
    /// The buffers its data goes to, a scatter list (None: it has none).
    fn read_bufs(&mut self) -> Option<&mut [IoBuf]>;
    /// `n` more bytes of its data were received.
    fn received(&mut self, n: u32);
}

/// Receives `len` bytes of data of command `slot` of `slots` at byte `at` of its buffers,
/// straight into them: each segment is taken out of the command while `rx` fills it (the table
/// is not borrowed across the wait), shown to `show` (the decoder: it checks the digest and
/// says where the PDU ends) and put back. The bytes must arrive within 10 s and 1 s per MiB.
/// Returns the last event `show` gave; data of a PDU `what` beyond the command's buffers is
/// the peer's protocol error.
pub async fn place<T: Reads, E>(
    slots: &RefCell<SlotTable<T>>,
    slot: u32,
    rx: &mut Rx<'_>,
    at: u32,
    len: usize,
    what: &str,
    mut show: impl FnMut(&[u8]) -> Option<E>,
) -> Result<Option<E>, Stop> {
    let allowance = Some(Duration::from_secs(10 + (len >> 20) as u64));
    let mut off = at as usize;
    let end = off + len;
    let mut event = None;
    let mut seg_start = 0usize;
    let mut i = 0usize;
    while off < end {
        // Take the segment holding `off` out of the command while data is received into it.
        let buf = {
            let mut slots = slots.borrow_mut();
            let Some(bufs) = slots[slot as usize].read_bufs() else {
                return Err(Stop::Violation(format!("{what} for a command without buffers")));
            };
            let Some(b) = bufs.get_mut(i) else {
                return Err(Stop::Violation(format!("{what} beyond the read's buffers")));
            };
            if off >= seg_start + b.len() {
                seg_start += b.len();
                i += 1;
                continue;
            }
            std::mem::replace(b, IoBuf::empty())
        };
        let seg_len = buf.len();
        let from = off - seg_start;
        let n = (seg_len - from).min(end - off);
        let (res, buf) = rx.fill(buf, from, n, allowance).await;
        let ev = show(&buf[from..from + n]);
        {
            let mut slots = slots.borrow_mut();
            let c = &mut slots[slot as usize];
            if let Some(b) = c.read_bufs().and_then(|bufs| bufs.get_mut(i)) {
                *b = buf;
            }
            if res.is_ok() {
                c.received(n as u32);
            }
        }
        res.map_err(Stop::Closed)?;
        if ev.is_some() {
            event = ev;
        }
        off += n;
        seg_start += seg_len;
        i += 1;
    }
    Ok(event)
}

/// Waits for `f` until `deadline`: None if it passed first.
pub async fn with_deadline<T>(f: impl Future<Output = T>, deadline: Instant) -> Option<T> {
    let mut f = std::pin::pin!(f);
    let mut sleep = std::pin::pin!(ferrite_reactor::sleep(deadline.saturating_duration_since(Instant::now())));
    poll_fn(|cx| {
        if let Poll::Ready(v) = f.as_mut().poll(cx) {
            return Poll::Ready(Some(v));
        }
        sleep.as_mut().poll(cx).map(|_| None)
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_reactor::net::Socket;
    use ferrite_reactor::{Engine, EngineConfig, ReactorMode};
    use std::io::{Read, Write};
    use std::os::fd::OwnedFd;

    #[test]
    fn host_phases_follow_their_table() {
        use HostPhase::*;
        assert!(Free.may_become(Sent));
        assert!(Sent.may_become(Free) && Sent.may_become(Answered));
        assert!(Answered.may_become(Free));
        assert!(!Free.may_become(Answered) && !Answered.may_become(Sent) && !Free.may_become(Free));
    }

    #[test]
    fn an_answer_without_data_in_send_ends_the_command_at_once() {
        let mut f: Flight<u8> = Flight::default();
        f.start(1, 0);
        assert!(f.is_sent());
        assert_eq!(f.answer(7, 1, 0), Some(7));
        assert_eq!(f.phase(), HostPhase::Free);
        f.start(1, 0);
        assert!(f.is_sent(), "the slot takes its next command");
    }

    #[test]
    fn an_answer_during_the_send_of_its_data_waits_for_that_send() {
        let mut f: Flight<u8> = Flight::default();
        f.start(1, 3);
        assert!(f.queued());
        assert!(f.queued());
        assert_eq!(f.sent(), None, "no answer yet");
        assert!(f.queued());
        assert_eq!(f.answer(9, 1, 3), None, "data still with the kernel");
        assert_eq!(f.phase(), HostPhase::Answered);
        assert!(!f.is_sent(), "a PDU of the peer names it no more");
        assert_eq!(f.sent(), None, "one PDU still in send");
        let end = f.sent().expect("the last send gives the answer back");
        assert_eq!(f.answer(end, 1, 3), Some(9));
        assert_eq!(f.phase(), HostPhase::Free);
    }

    #[test]
    fn a_forced_end_drops_the_sends_and_the_kept_answer() {
        let mut f: Flight<u8> = Flight::default();
        f.start(1, 0);
        assert!(f.queued());
        assert_eq!(f.answer(1, 1, 0), None);
        f.end(1, 0);
        assert_eq!(f.phase(), HostPhase::Free);
        f.start(1, 0);
        assert!(f.queued());
        f.sends_lost();
        assert_eq!(f.answer(2, 1, 0), Some(2), "no send left to wait for");
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "an answer for a free slot")]
    fn an_answer_for_a_free_slot_is_caught() {
        let mut f: Flight<u8> = Flight::default();
        f.answer(1, 1, 0);
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "not queued")]
    fn a_send_counted_twice_is_caught() {
        let mut f: Flight<u8> = Flight::default();
        f.start(1, 0);
        assert!(f.queued());
        f.sent();
        f.sent();
    }

    #[test]
    fn the_in_send_count_does_not_wrap() {
        // 65,536 PDUs for one command (a u16 count wrapped to 0 here and ended the command with
        // its data still queued).
        let mut f: Flight<u8> = Flight::default();
        f.start(1, 0);
        for _ in 0..65_536 {
            assert!(f.queued());
        }
        assert_eq!(f.in_send(), 65_536);
        assert_eq!(f.answer(1, 1, 0), None, "its data is still queued");
        for _ in 0..65_535 {
            assert_eq!(f.sent(), None);
        }
        assert_eq!(f.sent(), Some(1), "ends with its last send");
    }

    #[test]
    fn a_full_in_send_count_refuses_the_pdu() {
        let mut f: Flight<u8> = Flight::default();
        f.start(1, 0);
        f.in_send = u32::MAX;
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f.queued()));
        // Debug builds assert; release builds refuse.
        assert!(matches!(r, Err(_) | Ok(false)));
        assert_eq!(f.in_send, u32::MAX, "unchanged");
    }

    #[test]
    fn a_callers_command_reads_into_its_own_buffer_if_it_has_one() {
        let (tx, _rx) = oneshot::channel::<Result<(), String>>();
        let mut o = Owner::Wait { tx, out: None, inb: Some(IoBuf::heap(8)) };
        assert_eq!(o.read_bufs().map(|b| (b.len(), b[0].len())), Some((1, 8)));
        let (tx, _rx) = oneshot::channel::<Result<(), String>>();
        let mut o = Owner::Wait { tx, out: Some(IoBuf::heap(8)), inb: None };
        assert!(o.read_bufs().is_none(), "data to send is not a read's destination");
    }

    /// A read command of the tests: its scatter list and the bytes it received.
    #[derive(Default)]
    struct ReadCmd {
        bufs: Vec<IoBuf>,
        got: u32,
    }

    impl Reads for ReadCmd {
        fn read_bufs(&mut self) -> Option<&mut [IoBuf]> {
            (!self.bufs.is_empty()).then_some(&mut self.bufs[..])
        }
        fn received(&mut self, n: u32) {
            self.got += n;
        }
    }

    fn engine() -> Engine {
        Engine::start(EngineConfig { cores: vec![0], mode: ReactorMode::Poll, ..Default::default() }).unwrap()
    }

    fn pair() -> (Socket, std::os::unix::net::UnixStream) {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let fd: OwnedFd = a.into();
        (Socket::new(fd), b)
    }

    #[test]
    fn placed_data_lands_across_segments_at_its_offset() {
        let e = engine();
        let out = e.run_async(0, || async {
            let (sock, mut peer) = pair();
            let slots: RefCell<SlotTable<ReadCmd>> = RefCell::new(SlotTable::default());
            let s = slots.borrow_mut().take(4, ReadCmd::default).unwrap();
            slots.borrow_mut()[s as usize].bufs = [4usize, 8, 4].map(IoBuf::heap).into_iter().collect();
            // Bytes 2..14 of the read: the end of the first segment, the second, the third's start.
            peer.write_all(&(1..=12).collect::<Vec<u8>>()).unwrap();
            peer.write_all(b"next").unwrap();
            let mut rx = Rx::new(&sock);
            let mut shown = Vec::new();
            let ev = place(&slots, s, &mut rx, 2, 12, "data", |d| {
                shown.extend_from_slice(d);
                Some(shown.len())
            })
            .await
            .unwrap();
            let (bufs, got) = {
                let c = &slots.borrow()[s as usize];
                (c.bufs.iter().map(|b| b.to_vec()).collect::<Vec<Vec<u8>>>(), c.got)
            };
            // What follows the data stays for the next PDU.
            let (res, rest) = rx.fill(IoBuf::heap(4), 0, 4, None).await;
            res.unwrap();
            (ev, shown, bufs, got, rest.to_vec())
        });
        let (ev, shown, bufs, got, rest) = out.wait().unwrap();
        assert_eq!(ev, Some(12), "the last event shown");
        assert_eq!(shown, (1..=12).collect::<Vec<u8>>(), "every byte shown once, in order");
        assert_eq!(bufs, vec![vec![0, 0, 1, 2], (3..=10).collect(), vec![11, 12, 0, 0]]);
        assert_eq!(got, 12);
        assert_eq!(rest, b"next");
        e.stop();
        e.join();
    }

    #[test]
    fn data_beyond_the_buffers_or_for_none_is_the_peers_error() {
        let e = engine();
        let out = e.run_async(0, || async {
            let (sock, mut peer) = pair();
            peer.write_all(&[0u8; 32]).unwrap();
            let slots: RefCell<SlotTable<ReadCmd>> = RefCell::new(SlotTable::default());
            let s = slots.borrow_mut().take(4, ReadCmd::default).unwrap();
            let mut rx = Rx::new(&sock);
            let none = place(&slots, s, &mut rx, 0, 4, "Data-In", |_| None::<()>).await;
            slots.borrow_mut()[s as usize].bufs.push(IoBuf::heap(4));
            let beyond = place(&slots, s, &mut rx, 0, 8, "Data-In", |_| None::<()>).await;
            let got = slots.borrow()[s as usize].got;
            (format!("{none:?}"), format!("{beyond:?}"), got)
        });
        let (none, beyond, got) = out.wait().unwrap();
        assert!(none.contains("Violation(\"Data-In for a command without buffers\")"), "{none}");
        assert!(beyond.contains("Violation(\"Data-In beyond the read's buffers\")"), "{beyond}");
        assert_eq!(got, 4, "the first segment was filled");
        e.stop();
        e.join();
    }

    /// A queued PDU of the tests: its bytes and its command.
    struct Pdu {
        bytes: Vec<u8>,
        slot: Option<u16>,
    }

    impl Outgoing for Pdu {
        fn parts(&self, parts: &mut Vec<(*const u8, usize)>) {
            parts.push((self.bytes.as_ptr(), self.bytes.len()));
        }
        fn slot(&self) -> Option<u16> {
            self.slot
        }
    }

    #[test]
    fn the_writer_sends_what_is_queued_then_tells_the_commands() {
        let e = engine();
        let out = e.run_async(0, || async {
            let (sock, mut peer) = pair();
            let core = std::rc::Rc::new(ConnCore::new("test", 1, sock, "peer".into()));
            let queue: std::rc::Rc<RefCell<Vec<Pdu>>> = std::rc::Rc::default();
            let told = std::rc::Rc::new(RefCell::new(Vec::new()));
            let (c, q, t) = (core.clone(), queue.clone(), told.clone());
            let writer = ferrite_reactor::spawn_local(async move {
                // SAFETY: each entry's bytes are its own.
                unsafe { write_loop(&c, &q, |slot| t.borrow_mut().push(slot)) }.await
            });
            queue.borrow_mut().push(Pdu { bytes: b"head".to_vec(), slot: None });
            queue.borrow_mut().push(Pdu { bytes: b"data".to_vec(), slot: Some(5) });
            core.wake_writer();
            ferrite_reactor::sleep(Duration::from_millis(20)).await;
            queue.borrow_mut().push(Pdu { bytes: b"more".to_vec(), slot: Some(2) });
            core.wake_writer();
            ferrite_reactor::sleep(Duration::from_millis(20)).await;
            let mut got = [0u8; 12];
            peer.read_exact(&mut got).unwrap();
            core.close();
            let res = writer.await;
            let told = told.borrow().clone();
            (got, told, res.is_ok())
        });
        let (got, told, ok) = out.wait().unwrap();
        assert_eq!(&got, b"headdatamore");
        assert_eq!(told, vec![5, 2], "each command told once its PDU was sent");
        assert!(ok, "a close ends the writer without an error");
        e.stop();
        e.join();
    }
}
