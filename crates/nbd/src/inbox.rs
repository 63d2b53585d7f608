//! The transmission reader's input: request headers assembled from received chunks, and write
//! payloads placed in their I/O buffers.
//!
//! Headers come from the socket's receive stream (`RecvStream`): chunks in the reactor's
//! provided buffer ring, so a connection waiting for its next request holds no buffer of its
//! own. A write's payload goes into the pool buffer that goes to the bdev: the bytes that
//! already arrived in chunks with (or after) its header are copied, the receive is stopped, and
//! the rest is received straight into the buffer. After such a payload the next header is
//! received with a single-buffer receive (`next_single`), so a stream of large writes copies
//! at most one ring buffer of each payload; a request that needs no direct payload receive
//! brings the multishot receive back.

use ferrite_reactor::net::{RecvStream, Socket};
use ferrite_reactor::{IoBuf, RecvChunk};

/// What waiting for a request header gave.
pub(crate) enum Header<const N: usize> {
    /// The header's bytes.
    Bytes([u8; N]),
    /// The connection is closing: read nothing more.
    Closing,
}

/// A connection's received bytes not yet parsed, and how to receive more.
pub(crate) struct Inbox<'a> {
    sock: &'a Socket,
    stream: RecvStream<'a>,
    /// The chunk being parsed (None once every byte of it was taken: its buffer is back).
    cur: Option<RecvChunk>,
    /// Receive the next header one buffer at a time (a payload went straight into its buffer).
    single: bool,
}

impl<'a> Inbox<'a> {
    /// An inbox on `sock`, which must have no receive of its own in flight.
    pub(crate) fn new(sock: &'a Socket) -> Self {
        Self { sock, stream: sock.recv_stream(), cur: None, single: false }
    }

    /// True once the receive saw the end of stream or an error (bytes before it may still wait
    /// to be parsed).
    pub(crate) fn ended(&self) -> bool {
        self.stream.has_ended()
    }

    /// The reader pauses (back-pressure): leave further bytes in the socket.
    pub(crate) fn pause(&mut self) {
        self.stream.disarm();
    }

    /// Copies received bytes into `dst` without waiting; returns how many.
    fn take_buffered(&mut self, dst: &mut [u8]) -> usize {
        self.stream.take_into(&mut self.cur, dst)
    }

    /// The next request header of `N` bytes; `closing` is checked before each receive.
    pub(crate) async fn header<const N: usize>(&mut self, closing: impl Fn() -> bool) -> Result<Header<N>, String> {
        let mut hdr = [0u8; N];
        let mut have = self.take_buffered(&mut hdr);
        while have < N {
            if closing() {
                return Ok(Header::Closing);
            }
            let next = if self.single { self.stream.next_single().await } else { self.stream.next().await };
            match next {
                Ok(Some(c)) => self.cur = Some(c),
                Ok(None) => return Err("client went away without NBD_CMD_DISC".into()),
                Err(e) => return Err(format!("receive: {e}")),
            }
            have += self.take_buffered(&mut hdr[have..]);
        }
        Ok(Header::Bytes(hdr))
    }

    /// Fills all of `buf` (a write's payload, which follows its header in the stream). Returns
    /// the buffer, full, or the error that stopped the receive.
    pub(crate) async fn payload(
        &mut self,
        mut buf: IoBuf,
        deadline: Option<std::time::Instant>,
    ) -> (std::io::Result<()>, IoBuf) {
        // The header's chunk (and chunks the kernel delivered after it) may carry the start of
        // the payload: just those bytes are copied, as the old staging buffer's read-ahead was.
        let mut have = self.take_buffered(&mut buf[..]);
        if have < buf.len() {
            // The rest goes straight into the payload buffer: stop the stream first (whatever
            // it receives until it stops is queued and copied), then receive directly.
            self.stream.stop().await;
            have += self.take_buffered(&mut buf[have..]);
        }
        self.single = have < buf.len();
        if !self.single {
            return (Ok(()), buf);
        }
        match deadline {
            Some(d) => self.sock.recv_exact_by(buf, have, d).await,
            None => self.sock.recv_exact(buf, have).await,
        }
    }

    /// A request with no payload to receive directly: headers may come by multishot again.
    pub(crate) fn no_direct_payload(&mut self) {
        self.single = false;
    }
}
