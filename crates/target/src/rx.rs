//! A connection's receive side (targets and hosts: NVMe/TCP, iSCSI): bytes in chunks from the reactor's provided buffer ring (an
//! idle connection holds no buffer), and data placed into command buffers, copied from chunks
//! when it is small or already here, received straight into the buffer when it is large.

use ferrite_reactor::net::{RecvStream, Socket};
use ferrite_reactor::{IoBuf, RecvChunk, Sleep};
use std::future::Future;
use std::time::Instant;

/// Data larger than this that has not arrived yet is received straight into its buffer
/// (stopping the multishot receive costs a round trip, worth it only for large data).
const DIRECT_FROM: usize = 64 << 10;
/// Most bytes one plain receive takes after data received straight into its buffer.
const SINGLE: usize = 16 << 10;
/// After data received straight into its buffer, this many chunks are taken one buffer at a time
/// (a multishot receive would take the next PDU's data into ring buffers, to be copied); a run
/// of large writes keeps it so, anything else goes back to the multishot receive after them.
const SINGLE_CHUNKS: u8 = 8;
/// Reactor turns on which the rest of a large payload is taken by a plain receive as it
/// arrives, before a ring receive waits for what is still missing. Reading the socket as the
/// data comes keeps the window open and the ACKs going from the receiver: on a loopback with
/// BBR, 128 KiB writes went from 0.61-0.79 to 0.92-0.94 of SPDK's target and the host's 128 KiB
/// reads from 0.68 to 0.81 of SPDK's host (docs/perf-log/2026-11-28-nvmf-target-vs-spdk.md); with cubic no change. The
/// turn's other work runs between two receives; past the bound (a slow sender) the reactor
/// stops spending syscalls on it.
const POLL_TURNS: u32 = 256;

/// A connection's received bytes not yet used, and how to receive more.
pub struct Rx<'a> {
    sock: &'a Socket,
    stream: RecvStream<'a>,
    cur: Option<RecvChunk>,
    /// Chunks still to receive one buffer at a time, with a plain receive first: data went
    /// straight into its buffer lately, and more such data may follow (see `SINGLE_CHUNKS`).
    single: u8,
    /// The timer that bounds waits for a command's data, and when it is due: kept across waits
    /// (most end long before it) so that a wait arms no timer of its own (a timer allocates).
    guard: Option<(Instant, Sleep)>,
}

impl<'a> Rx<'a> {
    /// A receiver on `sock`, which must have no receive of its own in flight.
    pub fn new(sock: &'a Socket) -> Self {
        Self { sock, stream: sock.recv_stream(), cur: None, single: 0, guard: None }
    }

    /// The chunk being parsed, waiting for one if none is left. Err at end of stream or error.
    pub async fn chunk(&mut self) -> Result<&mut RecvChunk, String> {
        while self.cur.as_ref().is_none_or(|c| c.is_empty()) {
            self.cur = None;
            if let Some(c) = self.stream.try_next() {
                self.cur = Some(c);
                continue;
            }
            let single = self.single > 0;
            if single {
                self.single -= 1;
                // The stream is stopped, and what follows the data (the next header, often)
                // has most likely arrived: a plain receive takes it without a ring round trip.
                let mut b = ferrite_reactor::alloc_buf(SINGLE);
                if let Some(n) = self.try_take(&mut b[..])? {
                    self.cur = Some(RecvChunk::from_buf(b, n));
                    continue;
                }
            }
            let next = if single { self.stream.next_single().await } else { self.stream.next().await };
            match next {
                Ok(Some(c)) => self.cur = Some(c),
                Ok(None) => return Err("the peer closed the connection".into()),
                Err(e) => return Err(format!("receive: {e}")),
            }
        }
        Ok(self.cur.as_mut().expect("chunk present"))
    }

    /// As `chunk`, but Err once `deadline` has passed. The kept timer (`guard`) serves: one due
    /// by the deadline wakes the wait at the latest then, and one that fires early is re-armed
    /// for what is left; only one due after the deadline is replaced.
    async fn chunk_by(&mut self, deadline: Instant) -> Result<&mut RecvChunk, String> {
        loop {
            let mut guard = match self.guard.take() {
                Some((due, timer)) if due <= deadline => (due, timer),
                _ => {
                    let mut timer = ferrite_reactor::sleep(deadline.saturating_duration_since(Instant::now()));
                    // Armed now, not at its first poll: a guard kept after a wait whose chunk was
                    // already there (the race never polled it) must still be due at `deadline`.
                    std::future::poll_fn(|cx| {
                        let _ = std::pin::Pin::new(&mut timer).poll(cx);
                        std::task::Poll::Ready(())
                    })
                    .await;
                    (deadline, timer)
                }
            };
            let got = ferrite_reactor::net::race(async { self.chunk().await.map(|_| true) }, async {
                (&mut guard.1).await;
                Ok(false)
            })
            .await;
            match got {
                Ok(true) => {
                    self.guard = Some(guard);
                    return Ok(self.cur.as_mut().expect("chunk present"));
                }
                Ok(false) if Instant::now() >= deadline => {
                    return Err("a command's data did not arrive in time".to_string());
                }
                Ok(false) => {} // fired for an earlier deadline: dropped, and re-armed above
                Err(e) => return Err(e),
            }
        }
    }

    /// What the socket holds now, up to `dst.len()` bytes, by a plain non-blocking receive (the
    /// stream must be stopped): Some(count), or None if nothing is there. End of stream is an
    /// error, as in `chunk`.
    fn try_take(&self, dst: &mut [u8]) -> Result<Option<usize>, String> {
        match self.sock.try_recv(dst) {
            Ok(0) => Err("the peer closed the connection".into()),
            Ok(n) => Ok(Some(n)),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(format!("receive: {e}")),
        }
    }

    /// True if a received chunk is waiting to be parsed.
    pub fn has_buffered(&mut self) -> bool {
        if self.cur.as_ref().is_some_and(|c| !c.is_empty()) {
            return true;
        }
        self.cur = self.stream.try_next();
        self.cur.is_some()
    }

    /// Copies received bytes into `dst` without waiting; returns how many.
    fn take_buffered(&mut self, dst: &mut [u8]) -> usize {
        self.stream.take_into(&mut self.cur, dst)
    }

    /// Fills `buf[at..at + len]` with the next `len` bytes of the stream, which must arrive
    /// within `allowance` of the first wait for them (None: no limit; bytes already received
    /// cost no clock read). Returns the buffer and whether it worked.
    pub async fn fill(
        &mut self,
        mut buf: IoBuf,
        at: usize,
        len: usize,
        allowance: Option<std::time::Duration>,
    ) -> (Result<(), String>, IoBuf) {
        let end = at + len;
        let mut have = at + self.take_buffered(&mut buf[at..end]);
        let deadline = if have < end { allowance.map(|a| Instant::now() + a) } else { None };
        self.single = 0;
        while have < end && end - have <= DIRECT_FROM {
            // Small remainders come with the next chunks (by the deadline: a host that stops
            // sending mid-data would otherwise hold the buffer for as long as it stays).
            let next = match deadline {
                Some(d) => self.chunk_by(d).await,
                None => self.chunk().await,
            };
            let c = match next {
                Ok(c) => c,
                Err(e) => return (Err(e), buf),
            };
            let k = c.len().min(end - have);
            buf[have..have + k].copy_from_slice(&c[..k]);
            c.consume(k);
            have += k;
        }
        if have == end {
            return (Ok(()), buf);
        }
        // Large: stop the stream (what it received meanwhile is queued and copied), then
        // receive the rest straight into the buffer.
        self.stream.stop().await;
        have += self.take_buffered(&mut buf[have..end]);
        if have == end {
            return (Ok(()), buf);
        }
        // Most often the rest has arrived already, or is arriving: plain receives take it, one
        // per reactor turn (the turn's other work runs in between), without a ring round trip
        // or a timeout to arm; a ring receive waits for what is still missing after that.
        let mut turns = 0;
        loop {
            match self.try_take(&mut buf[have..end]) {
                Ok(n) => have += n.unwrap_or(0),
                Err(e) => return (Err(e), buf),
            }
            if have == end || turns >= POLL_TURNS {
                break;
            }
            turns += 1;
            ferrite_reactor::next_turn().await;
        }
        self.single = SINGLE_CHUNKS;
        if have == end {
            return (Ok(()), buf);
        }
        let whole = buf.len();
        buf.set_len(end);
        let (res, mut buf) = match deadline {
            Some(d) => self.sock.recv_exact_by(buf, have, d).await,
            None => self.sock.recv_exact(buf, have).await,
        };
        buf.set_len(whole);
        (res.map_err(|e| format!("receive data: {e}")), buf)
    }

    /// Stops receiving, waiting until the receive in flight has ended (the socket is then the
    /// caller's to hand on); true if received bytes are left unparsed.
    pub async fn stop(&mut self) -> bool {
        self.stream.stop().await;
        self.has_buffered()
    }

    /// Pauses receiving (back-pressure): further bytes stay in the socket.
    pub fn pause(&mut self) {
        self.stream.disarm();
    }
}
