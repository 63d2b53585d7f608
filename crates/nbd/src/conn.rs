//! One NBD connection, owned by one reactor: the newstyle handshake, then transmission.
//!
//! Transmission runs two local tasks over one socket: the reader parses requests from chunks
//! received into the reactor's provided buffer ring (see `inbox`: a connection waiting for a
//! request holds no buffer) and submits bdev I/O (a write's payload is copied from the chunks
//! that carry its start, and the rest received straight into its I/O buffer); completions queue
//! replies; the writer sends every queued reply in one `sendmsg` (read data goes from the I/O
//! buffer, or from memory the bdev lends for a zero-copy read, to the socket without a copy in
//! Ferrite).

use crate::export::{self, ConnInfo, Export};
use crate::handshake::{self as hs, OptionRequest};
use crate::inbox::{Header, Inbox};
use crate::proto::*;
use crate::transmission::{self as tx, Command, Limits, Request};
use ferrite_bdev::{Bdev, BdevDesc, Completed, IoBufs, IoChannel, IoCompleter, IoRequest, IoStatus, IoType};
use ferrite_reactor::net::{SendCache, Socket};
use ferrite_reactor::{alloc_buf, IoBuf};
use ferrite_target::table::{self, ConnTable, Served, WatchdogOptions};
use ferrite_target::{ConnCore, SlotTable};
use std::cell::{Cell, RefCell};
use std::future::poll_fn;
use std::rc::Rc;
use std::task::Poll;
use std::time::{Duration, Instant};

/// Options a client may send before it must choose an export.
const MAX_OPTIONS: usize = 128;
/// Largest read or write payload accepted (advertised as the maximum block size).
pub const MAX_PAYLOAD: u32 = 32 << 20;
/// Requests in flight per connection before the reader stops reading.
const MAX_IN_FLIGHT: u32 = 256;
/// Read and write payload bytes a connection may hold (requests being served and replies not yet
/// sent) before the reader stops reading; at least MAX_PAYLOAD, so any valid request can start.
const MAX_HELD_BYTES: u64 = 2 * MAX_PAYLOAD as u64;

/// The parts of a connection that closing needs (shared by the reader, the writer and the
/// close path): the kit's connection core, and the export it serves once chosen.
pub(crate) struct Handle {
    core: ConnCore,
    export: RefCell<Option<String>>,
}

impl std::ops::Deref for Handle {
    type Target = ConnCore;
    fn deref(&self) -> &ConnCore {
        &self.core
    }
}

impl Served for Handle {
    fn core(&self) -> &ConnCore {
        &self.core
    }

    /// Closes a connection whose client stopped reading its replies or sending a write's
    /// payload.
    fn watch(&self, now: u64) {
        if self.receiving.stalled(now, PAYLOAD_BASE_TIME, PER_MIB) {
            let len = self.receiving.get().map_or(0, |(_, n)| n);
            log::warn!("nbd connection {}: the client has not sent a write's {len} bytes in time; closing", self.id);
            self.close();
        } else if self.sending.stalled(now, REPLY_BASE_TIME, PER_MIB) {
            log::warn!("nbd connection {}: the client has not read its replies in time; closing", self.id);
            self.close();
        }
    }
}

ferrite_reactor::reactor_local! {
    /// This reactor's connections, by connection id.
    static LIVE: RefCell<ConnTable<Handle>> = const { RefCell::new(ConnTable::new()) };
}

/// The reactor's watchdog: once a second it closes connections whose clients stopped reading
/// their replies or sending a write's payload (one timer per reactor, none per request), and
/// it stops when the reactor has no connection left.
const WATCHDOG: WatchdogOptions = WatchdogOptions { period: Duration::from_secs(1), proto: "nbd" };

/// Closes this reactor's connections that `pred` selects (by export name).
pub(crate) fn close_local(pred: &dyn Fn(&Handle) -> bool) -> usize {
    table::close_where(&LIVE, pred)
}

/// Closes connections on this reactor using export `name`.
pub(crate) fn close_export_local(name: &str) -> usize {
    close_local(&|h: &Handle| h.export.borrow().as_deref() == Some(name))
}

/// Closes every connection on this reactor.
pub(crate) fn close_all_local() -> usize {
    close_local(&|_| true)
}

/// How a listener's connections are served.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnSettings {
    /// Time a client has from connecting to the end of the handshake (None: unlimited).
    pub(crate) handshake_timeout: Option<Duration>,
}

/// Serves one accepted connection to the end. Runs as a task on the reactor that owns it;
/// `_slot` (the listener's connection count) is given back when it ends.
pub(crate) async fn serve<G>(sock: Socket, peer: String, listen: String, settings: ConnSettings, _slot: G) {
    let reactor = ferrite_reactor::current().unwrap_or(0);
    let id = {
        let mut t = export::tables();
        let id = t.next_conn;
        t.next_conn += 1;
        t.conns.insert(id, ConnInfo { id, export: None, reactor, peer: peer.clone(), listen });
        id
    };
    let h = Rc::new(Handle { core: ConnCore::new("nbd", id, sock, peer.clone()), export: RefCell::new(None) });
    if let Some(t) = settings.handshake_timeout {
        // A backstop, later than the handshake's own deadlines (which say more in the log).
        h.handshake_within(t + Duration::from_secs(2));
    }
    table::register(&LIVE, h.clone(), WATCHDOG);
    log::info!("nbd connection {id} from {peer} on reactor {reactor}");
    let deadline = settings.handshake_timeout.map(|t| Instant::now() + t);
    match handshake(&h, deadline).await {
        Ok(Some(n)) => {
            h.handshake_done();
            transmission(h.clone(), n).await
        }
        Ok(None) => {}
        Err(HandshakeEnd::TimedOut) => log::warn!(
            "nbd connection {id} from {peer}: handshake not finished within {:?}; closing",
            settings.handshake_timeout.unwrap_or_default()
        ),
        Err(HandshakeEnd::Failed(e)) => log::warn!("nbd connection {id}: handshake ended: {e}"),
    }
    table::unregister(&LIVE, id);
    export::tables().conns.remove(&id);
    log::info!("nbd connection {id} closed");
}

/// Why a handshake ended without an export.
enum HandshakeEnd {
    /// The client did not finish it in time.
    TimedOut,
    /// Anything else: a protocol error, the peer went away.
    Failed(String),
}

impl From<String> for HandshakeEnd {
    fn from(s: String) -> Self {
        Self::Failed(s)
    }
}

fn io_end(what: &str, e: std::io::Error) -> HandshakeEnd {
    if e.kind() == std::io::ErrorKind::TimedOut {
        HandshakeEnd::TimedOut
    } else {
        HandshakeEnd::Failed(format!("{what}: {e}"))
    }
}

async fn recv_n(sock: &Socket, n: usize, deadline: Option<Instant>) -> Result<IoBuf, HandshakeEnd> {
    let (res, buf) = match deadline {
        Some(d) => sock.recv_exact_by(alloc_buf(n), 0, d).await,
        None => sock.recv_exact(alloc_buf(n), 0).await,
    };
    res.map(|_| buf).map_err(|e| io_end("receive", e))
}

async fn send_by(sock: &Socket, data: Vec<u8>, deadline: Option<Instant>) -> Result<(), HandshakeEnd> {
    match deadline {
        Some(d) => sock.send_all_by(data, d).await,
        None => sock.send_all(data).await,
    }
    .map_err(|e| io_end("send", e))
}

/// What the handshake settled.
struct Negotiated {
    desc: BdevDesc,
    limits: Limits,
}

/// The export's flags. It is read-only if exported so or if its bdev takes no writes (an lvol
/// snapshot): clients then know before they try.
fn transmission_flags(e: &Export, b: &Bdev, structured: bool) -> u16 {
    let read_only = e.read_only || !b.supports(IoType::Write);
    let mut f = HAS_FLAGS | SEND_FUA | CAN_MULTI_CONN | SEND_CACHE;
    if read_only {
        f |= READ_ONLY;
    }
    if b.supports(IoType::Flush) {
        f |= SEND_FLUSH;
    }
    if b.supports(IoType::Unmap) && !read_only {
        f |= SEND_TRIM;
    }
    if b.supports(IoType::WriteZeroes) && !read_only {
        // Every module that supports write-zeroes does it without writing a payload (malloc:
        // memset; null: nothing; uring: fallocate), so FAST_ZERO requests never need refusing.
        f |= SEND_WRITE_ZEROES | SEND_FAST_ZERO;
    }
    if structured {
        f |= SEND_DF;
    }
    f
}

/// Opens the export's bdev for this connection; the bdev's removal closes the connection.
fn open_export(h: &Rc<Handle>, name: &str, structured: bool) -> Result<(Export, Negotiated, u16), String> {
    let e = export::get(name).ok_or_else(|| format!("no export named {name:?}"))?;
    let id = h.id;
    let desc = Bdev::open(&e.bdev, !e.read_only, move || {
        close_local(&|h: &Handle| h.id == id);
    })
    .map_err(|err| format!("export {name}: {err}"))?;
    if desc.bdev().id() != e.bdev_id {
        // The export's bdev was deleted and another took its name.
        return Err(format!("no export named {name:?}"));
    }
    let b = desc.bdev().clone();
    let flags = transmission_flags(&e, &b, structured);
    let limits = Limits {
        size: b.size_bytes(),
        block_size: b.block_size(),
        max_payload: MAX_PAYLOAD,
        read_only: flags & READ_ONLY != 0,
        flush: flags & SEND_FLUSH != 0,
        fua: true,
        trim: flags & SEND_TRIM != 0,
        write_zeroes: flags & SEND_WRITE_ZEROES != 0,
        structured,
    };
    Ok((e, Negotiated { desc, limits }, flags))
}

async fn handshake(h: &Rc<Handle>, deadline: Option<Instant>) -> Result<Option<Negotiated>, HandshakeEnd> {
    let sock = &h.sock;
    send_by(sock, hs::server_greeting().to_vec(), deadline).await?;
    let b = recv_n(sock, 4, deadline).await?;
    let cf = hs::parse_client_flags(&[b[0], b[1], b[2], b[3]]).map_err(|e| e.to_string())?;
    let mut structured = false;
    for _ in 0..MAX_OPTIONS {
        let hb = recv_n(sock, 16, deadline).await?;
        let mut hdr = [0u8; 16];
        hdr.copy_from_slice(&hb);
        let (opt, len) = hs::parse_option_header(&hdr).map_err(|e| e.to_string())?;
        let data = if len > 0 { recv_n(sock, len as usize, deadline).await? } else { alloc_buf(0) };
        let mut out = Vec::new();
        let mut chosen = None;
        match hs::parse_option(opt, &data) {
            Err(e) if opt == OPT_EXPORT_NAME => return Err(format!("bad NBD_OPT_EXPORT_NAME: {}", e.message).into()),
            Err(e) => {
                log::info!("nbd connection {}: refusing option {opt}: {}", h.id, e.message);
                hs::encode_error(&mut out, opt, e.reply, &e.message);
            }
            Ok(OptionRequest::ExportName(name)) => {
                // This option has no error reply: an unknown name closes the connection.
                let (e, n, flags) = open_export(h, &name, structured)?;
                hs::encode_export_name_reply(&mut out, n.limits.size, flags, cf.no_zeroes);
                chosen = Some((e, n));
            }
            Ok(OptionRequest::Abort) => {
                hs::encode_ack(&mut out, opt);
                let _ = send_by(sock, out, deadline).await;
                return Ok(None);
            }
            Ok(OptionRequest::List) => {
                for e in export::list() {
                    hs::encode_server(&mut out, &e.name, &e.description);
                }
                hs::encode_ack(&mut out, opt);
            }
            Ok(OptionRequest::StartTls) => hs::encode_error(&mut out, opt, REP_ERR_POLICY, "TLS is not supported"),
            Ok(OptionRequest::Info { name, requests } | OptionRequest::Go { name, requests }) => {
                match open_export(h, &name, structured) {
                    Err(msg) => hs::encode_error(&mut out, opt, REP_ERR_UNKNOWN, &msg),
                    Ok((e, n, flags)) => {
                        hs::encode_info_export(&mut out, opt, n.limits.size, flags);
                        if requests.contains(&INFO_NAME) {
                            hs::encode_info_name(&mut out, opt, &e.name);
                        }
                        if requests.contains(&INFO_DESCRIPTION) {
                            hs::encode_info_description(&mut out, opt, &e.description);
                        }
                        let bs = n.limits.block_size;
                        hs::encode_info_block_size(&mut out, opt, bs, bs.max(4096), MAX_PAYLOAD);
                        hs::encode_ack(&mut out, opt);
                        if opt == OPT_GO {
                            chosen = Some((e, n));
                        }
                    }
                }
            }
            Ok(OptionRequest::StructuredReply) if structured => {
                hs::encode_error(&mut out, opt, REP_ERR_INVALID, "structured replies already negotiated")
            }
            Ok(OptionRequest::StructuredReply) => {
                structured = true;
                hs::encode_ack(&mut out, opt);
            }
            Ok(_) => hs::encode_error(&mut out, opt, REP_ERR_UNSUP, "option not supported"),
        }
        send_by(sock, out, deadline).await?;
        if let Some((e, n)) = chosen {
            *h.export.borrow_mut() = Some(e.name.clone());
            if let Some(c) = export::tables().conns.get_mut(&h.id) {
                c.export = Some(e.name.clone());
            }
            log::info!("nbd connection {}: export {} (bdev {}), structured replies {structured}", h.id, e.name, e.bdev);
            return Ok(Some(n));
        }
    }
    Err(format!("more than {MAX_OPTIONS} options").into())
}

/// A request being served.
#[derive(Clone, Copy)]
struct Slot {
    req: Request,
    /// A FUA write whose flush is running.
    flushing: bool,
}

/// A reply ready to send: its header bytes and, for a successful read, the data.
struct Reply {
    hdr: [u8; 32],
    hdr_len: u8,
    /// A read's data: one buffer, or several when the bdev lent it in pieces.
    data: IoBufs,
    /// The request's payload bytes counted in `Conn::held_bytes`.
    held: u64,
}

struct Conn {
    h: Rc<Handle>,
    ch: IoChannel,
    limits: Limits,
    bs: u64,
    slots: RefCell<SlotTable<Option<Slot>>>,
    replies: RefCell<Vec<Reply>>,
    in_flight: Cell<u32>,
    /// Replies queued or being sent (they hold buffers until the client reads them).
    unsent: Cell<u32>,
    /// Payload bytes of reads and writes from request to sent reply (see `held_by`).
    held_bytes: Cell<u64>,
    me: std::rc::Weak<Conn>,
}

/// The payload bytes a request holds while it is served: its length for reads and writes.
fn held_by(req: &Request) -> u64 {
    match req.command {
        Command::Read | Command::Write => req.length as u64,
        _ => 0,
    }
}

fn nbd_error(s: IoStatus) -> u32 {
    match s {
        IoStatus::Success => 0,
        IoStatus::OutOfRange | IoStatus::Misaligned => EINVAL,
        IoStatus::Unsupported => ENOTSUP,
        IoStatus::Removed => ESHUTDOWN,
        IoStatus::Failed(e) if e == libc::ENOSPC => ENOSPC,
        IoStatus::Failed(e) if e == libc::EPERM || e == libc::EBADF || e == libc::EROFS => EPERM,
        IoStatus::Failed(e) if e == libc::ENOMEM => ENOMEM,
        IoStatus::NoMem => ENOMEM,
        // A remote NVMe namespace that is full or write-protected answers as such
        // (`IoStatus::errno` knows those statuses); other NVMe statuses are EIO.
        IoStatus::Nvme { .. } => nbd_error(IoStatus::Failed(s.errno())),
        IoStatus::Failed(_)
        | IoStatus::Aborted
        | IoStatus::Miscompare { .. }
        | IoStatus::TimedOut
        | IoStatus::Scsi { .. } => EIO,
    }
}

impl Conn {
    fn me(&self) -> Rc<dyn IoCompleter> {
        self.me.upgrade().expect("connection alive while it submits")
    }

    fn queue_reply(&self, req: &Request, error: u32, data: IoBufs) {
        if self.h.is_dead() {
            // Nobody to send to: free the reply (and its read data) now.
            self.held_bytes.set(self.held_bytes.get() - held_by(req));
            drop(data);
            self.h.wake_writer();
            return;
        }
        let mut r = Reply { hdr: [0; 32], hdr_len: 16, data: IoBufs::new(), held: held_by(req) };
        if self.limits.structured && req.command == Command::Read {
            match data {
                d if error == 0 && !d.is_empty() => {
                    let len: usize = d.iter().map(|b| b.len()).sum();
                    let mut h = [0u8; 28];
                    tx::encode_offset_data_header(&mut h, req.cookie, req.offset, len as u32, true);
                    r.hdr[..28].copy_from_slice(&h);
                    r.hdr_len = 28;
                    r.data = d;
                }
                _ => {
                    let mut v = Vec::with_capacity(32);
                    tx::encode_structured_error(&mut v, req.cookie, error.max(1), "");
                    let n = v.len().min(32);
                    r.hdr[..n].copy_from_slice(&v[..n]);
                    r.hdr_len = n as u8;
                }
            }
        } else {
            let mut h = [0u8; 16];
            tx::encode_simple_reply(&mut h, error, req.cookie);
            r.hdr[..16].copy_from_slice(&h);
            r.data = if error == 0 { data } else { IoBufs::new() };
        }
        self.replies.borrow_mut().push(r);
        self.unsent.set(self.unsent.get() + 1);
        self.h.wake_writer();
    }

    fn take_slot(&self, req: Request) -> u32 {
        // The reader stops at MAX_IN_FLIGHT requests (`may_read`), so a slot is always free.
        let mut slots = self.slots.borrow_mut();
        let i = slots.take(usize::MAX, || None).expect("the slot table is unbounded");
        slots[i as usize] = Some(Slot { req, flushing: false });
        drop(slots);
        self.in_flight.set(self.in_flight.get() + 1);
        i
    }

    fn release(&self, i: u32) {
        {
            let mut slots = self.slots.borrow_mut();
            slots[i as usize] = None;
            slots.release(i);
        }
        self.in_flight.set(self.in_flight.get() - 1);
        self.h.wake_reader();
        if self.h.is_closing() && self.in_flight.get() == 0 {
            self.h.wake();
        }
    }

    /// Starts the bdev I/O for a valid request.
    fn submit(&self, req: Request, payload: Option<IoBuf>) {
        let off = req.offset / self.bs;
        let n = req.length as u64 / self.bs;
        let io = match req.command {
            // Zero-copy where the bdev can lend its memory (malloc): the reply is sent from it.
            Command::Read => IoRequest::read_zcopy(off, n),
            Command::Write => IoRequest::write(off, n, payload.expect("write payload")),
            Command::Flush => IoRequest::no_payload(IoType::Flush, 0, 0),
            Command::Trim => IoRequest::no_payload(IoType::Unmap, off, n),
            Command::WriteZeroes => IoRequest::no_payload(IoType::WriteZeroes, off, n),
            _ => {
                // CACHE is a hint; validate() let nothing else through.
                self.queue_reply(&req, 0, IoBufs::new());
                return;
            }
        };
        let tag = self.take_slot(req);
        self.ch.submit(io, self.me(), tag as u64);
    }
}

impl IoCompleter for Conn {
    fn io_done(&self, tag: u64, mut io: Completed) {
        let slot = self.slots.borrow()[tag as usize].expect("completion for a busy slot");
        let req = slot.req;
        let fua =
            req.flags & FLAG_FUA != 0 && matches!(req.command, Command::Write | Command::Trim | Command::WriteZeroes);
        // A bdev without Flush has no volatile cache: what it completed is durable already.
        if io.status.is_ok() && fua && !slot.flushing && self.limits.flush {
            // Forced unit access: acknowledge only after a flush makes the write durable.
            if let Some(s) = self.slots.borrow_mut()[tag as usize].as_mut() {
                s.flushing = true;
            }
            self.ch.submit(IoRequest::no_payload(IoType::Flush, 0, 0), self.me(), tag);
            return;
        }
        let data = if req.command == Command::Read { std::mem::take(&mut io.req.bufs) } else { IoBufs::new() };
        self.queue_reply(&req, nbd_error(io.status), data);
        self.release(tag as u32);
    }
}

/// Waits until the reply queue has something, or the connection closes and drains.
async fn writer(c: Rc<Conn>) {
    // Grown on demand (an idle connection keeps them small).
    let mut batch: Vec<Reply> = Vec::new();
    let mut parts: Vec<(*const u8, usize)> = Vec::new();
    let send_memory = SendCache::default();
    loop {
        let done = poll_fn(|cx| {
            if !c.replies.borrow().is_empty() {
                return Poll::Ready(false);
            }
            if c.h.is_closing() && c.in_flight.get() == 0 {
                return Poll::Ready(true);
            }
            c.h.park_writer(cx);
            Poll::Pending
        })
        .await;
        if done {
            return;
        }
        std::mem::swap(&mut *c.replies.borrow_mut(), &mut batch);
        if c.h.is_dead() {
            // Queued before the connection died: free them unsent.
            c.unsent.set(c.unsent.get() - batch.len() as u32);
            c.held_bytes.set(c.held_bytes.get() - batch.iter().map(|r| r.held).sum::<u64>());
            batch.clear();
            continue;
        }
        parts.clear();
        for r in &batch {
            parts.push((r.hdr.as_ptr(), r.hdr_len as usize));
            for d in &r.data {
                parts.push((d.as_ptr(), d.len()));
            }
        }
        // A client that stops reading its replies is closed by its paused reader, which watches
        // how long this send takes (`Handle::watch`; no timer per send).
        let bytes: usize = parts.iter().map(|p| p.1).sum();
        c.h.sending.begin(bytes);
        // SAFETY: every part points into `batch` (headers inside its heap buffer, data in pool
        // buffers it owns), which send_parts keeps until the send completes.
        let (res, b) = unsafe { c.h.sock.send_parts(&send_memory, &parts, batch).await };
        c.h.sending.end();
        batch = b;
        c.unsent.set(c.unsent.get() - batch.len() as u32);
        c.held_bytes.set(c.held_bytes.get() - batch.iter().map(|r| r.held).sum::<u64>());
        batch.clear();
        c.h.wake_reader();
        if let Err(e) = res {
            if !c.h.is_closing() {
                log::info!("nbd connection {}: send failed: {e}", c.h.id);
            }
            c.h.close();
        }
    }
}

async fn transmission(h: Rc<Handle>, n: Negotiated) {
    let ch = match n.desc.channel() {
        Ok(ch) => ch,
        Err(e) => {
            log::warn!("nbd connection {}: {e}", h.id);
            return;
        }
    };
    let c = Rc::new_cyclic(|me| Conn {
        h: h.clone(),
        ch,
        limits: n.limits,
        bs: n.limits.block_size as u64,
        // Grown on demand, up to MAX_IN_FLIGHT (an idle connection keeps them small).
        slots: RefCell::new(SlotTable::default()),
        replies: RefCell::new(Vec::new()),
        in_flight: Cell::new(0),
        unsent: Cell::new(0),
        held_bytes: Cell::new(0),
        me: me.clone(),
    });
    let writer_task = ferrite_reactor::spawn_local(writer(c.clone()));
    if let Err(e) = reader(&c).await {
        if !h.is_closing() {
            log::info!("nbd connection {}: {e}", h.id);
        }
    }
    h.stop_taking();
    writer_task.await;
    h.sock.shutdown();
    drop(c);
    drop(n.desc);
}

/// How often a reader paused by back-pressure checks that its client is still connected.
const PAUSED_PEER_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// True if the peer of `fd` has closed or reset the connection (a non-blocking peek: no data is
/// taken; one syscall, made only while a reader is paused).
fn peer_gone(fd: std::os::fd::RawFd) -> bool {
    let mut b = 0u8;
    // SAFETY: peeks at most one byte into a local.
    let n = unsafe { libc::recv(fd, &mut b as *mut u8 as *mut _, 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    match n {
        0 => true,
        n if n > 0 => false,
        _ => !matches!(std::io::Error::last_os_error().raw_os_error(), Some(libc::EAGAIN) | Some(libc::EINTR)),
    }
}

/// Asks the bdev layer to abort every request of the connection still in flight (those waiting
/// in the layer, e.g. for memory, complete at once as Aborted; the rest complete as they do).
fn abort_in_flight(c: &Rc<Conn>) {
    ferrite_target::abort_all(c, std::slice::from_ref(&c.ch));
}

/// A write payload's buffer: from the reactor's pool or, past it, from the heap within the
/// reactor's budget (`--buf-heap-budget`), so that clients that announce large writes and send
/// nothing cannot make the daemon hold more than that. While both are spent the connection waits
/// (its client with it: the payload stays in the socket), looking again after 1 ms, then less
/// often, up to every 64 ms; every payload being received has a deadline (`Handle::watch`), so
/// memory comes back. Err if the connection closes or its client goes meanwhile, or if no
/// buffer that large can ever be had.
async fn payload_buf(c: &Conn, len: usize) -> Result<IoBuf, String> {
    let largest = ferrite_reactor::buf_pool().map_or(usize::MAX, |p| p.largest_grant());
    if len > largest {
        return Err(format!("write of {len} bytes: no buffer larger than {largest} bytes here (--buf-heap-budget)"));
    }
    let mut wait = PAYLOAD_MEMORY_WAIT;
    loop {
        if let Some(b) = ferrite_reactor::try_alloc_buf(len) {
            return Ok(b);
        }
        if c.h.is_closing() {
            return Err("closing".into());
        }
        if peer_gone(c.h.sock.raw_fd()) {
            return Err(format!("client went away while its write of {len} bytes waited for memory"));
        }
        ferrite_reactor::sleep(wait).await;
        wait = (wait * 2).min(PAYLOAD_MEMORY_WAIT_MOST);
    }
}

/// See [`payload_deadline`].
fn payload_time(len: u32) -> Duration {
    PAYLOAD_BASE_TIME + Duration::from_secs(u64::from(len) >> 20)
}

/// How long a write's payload may take to arrive: 10 s, plus 1 s per MiB (a client slower than
/// 1 MiB/s is treated as one that stopped sending). Only payloads above [`DEADLINE_FROM`] get
/// a linked timeout on their receive (it costs an allocation); every payload, of any size, is
/// also timed by the watchdog (`Handle::watch`), to within its period.
fn payload_deadline(len: u32) -> Option<std::time::Instant> {
    (len > DEADLINE_FROM).then(|| std::time::Instant::now() + payload_time(len))
}

/// See [`payload_deadline`].
const DEADLINE_FROM: u32 = 128 << 10;

/// How long a batch of replies may take to be sent: this, plus [`PER_MIB`] per MiB (a client
/// that does not read its replies would otherwise hold their buffers, and this reactor's
/// memory, for as long as it stays connected).
const REPLY_BASE_TIME: Duration = Duration::from_secs(30);
/// What a transfer may take per MiB beyond its base time (a peer slower than 1 MiB/s is treated
/// as one that stopped).
const PER_MIB: Duration = Duration::from_secs(1);

/// See [`payload_deadline`].
const PAYLOAD_BASE_TIME: Duration = Duration::from_secs(10);
/// How soon a connection waiting for payload memory looks again, at first.
const PAYLOAD_MEMORY_WAIT: Duration = Duration::from_millis(1);
/// How seldom it looks, at most.
const PAYLOAD_MEMORY_WAIT_MOST: Duration = Duration::from_millis(64);

/// True while the reader may take another request: below the caps of requests and payload
/// bytes in flight.
fn may_read(c: &Conn) -> bool {
    c.in_flight.get() + c.unsent.get() < MAX_IN_FLIGHT && c.held_bytes.get() < MAX_HELD_BYTES
}

/// Reads and dispatches requests until the client disconnects, errs, or the connection closes.
async fn reader(c: &Rc<Conn>) -> Result<(), String> {
    let sock = &c.h.sock;
    let mut inbox = Inbox::new(sock);
    loop {
        // Back-pressure: stop reading while too many requests or payload bytes are in flight or
        // replies wait for the client to read them.
        // A closing connection starts no more requests, even those already received: the bounds
        // hold during teardown too.
        // While paused, look every second whether the client is still there: a paused reader
        // does not read, so it would never see the client leave, and a connection whose
        // requests wait for memory (NoMem) would then never be torn down.
        // A paused reader also stops its receive: further requests stay in the socket rather than
        // take the reactor's ring buffers.
        if !c.h.is_closing() && !may_read(c) {
            inbox.pause();
        }
        let go_on = loop {
            let mut tick = std::pin::pin!(ferrite_reactor::sleep(PAUSED_PEER_CHECK));
            let ready = poll_fn(|cx| {
                if c.h.is_closing() {
                    return Poll::Ready(Some(false));
                }
                if may_read(c) {
                    return Poll::Ready(Some(true));
                }
                c.h.park_reader(cx);
                std::future::Future::poll(tick.as_mut(), cx).map(|_| None)
            })
            .await;
            match ready {
                Some(go) => break go,
                // Gone: the receive saw the end (or a reset) before it stopped, or the socket
                // says so (requests received but not yet parsed are dropped, as before).
                None if inbox.ended() || peer_gone(sock.raw_fd()) => {
                    abort_in_flight(c);
                    return Err("client went away while its requests waited".into());
                }
                None => {}
            }
        };
        if !go_on {
            return Ok(());
        }
        let raw = match inbox.header::<{ tx::REQUEST_LEN }>(|| c.h.is_closing()).await? {
            Header::Bytes(b) => b,
            Header::Closing => return Ok(()),
        };
        let req = tx::parse_request(&raw).map_err(|e| format!("bad request: {e}"))?;
        let valid = tx::validate(&req, &c.limits);
        // Every request but DISC gets exactly one reply, which gives these bytes back.
        c.held_bytes.set(c.held_bytes.get() + held_by(&req));
        // A write's payload follows its header whatever the verdict; one too large to take is
        // a stream we cannot resynchronise.
        let mut payload = None;
        if req.command == Command::Write {
            if req.length > MAX_PAYLOAD {
                return Err(format!("write of {} bytes exceeds the maximum {MAX_PAYLOAD}", req.length));
            }
            let buf = match payload_buf(c, req.length as usize).await {
                Ok(b) => b,
                Err(_) if c.h.is_closing() => return Ok(()),
                Err(e) => return Err(e),
            };
            c.h.receiving.begin(req.length as usize);
            let (res, buf) = inbox.payload(buf, payload_deadline(req.length)).await;
            c.h.receiving.end();
            res.map_err(|e| format!("receive write payload of {} bytes: {e}", req.length))?;
            payload = Some(buf);
        } else {
            inbox.no_direct_payload();
        }
        match valid {
            Err(errno) => {
                log::info!(
                    "nbd connection {}: refusing {:?} at {} len {} flags {:#x}: error {errno}",
                    c.h.id,
                    req.command,
                    req.offset,
                    req.length,
                    req.flags
                );
                c.queue_reply(&req, errno, IoBufs::new());
            }
            Ok(()) if req.command == Command::Disc => return Ok(()),
            Ok(()) => c.submit(req, payload),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_and_read_only_volumes_answer_enospc_and_eperm() {
        assert_eq!(nbd_error(IoStatus::Failed(libc::ENOSPC)), ENOSPC);
        assert_eq!(nbd_error(IoStatus::nvme(0, 0x81)), ENOSPC);
        assert_eq!(nbd_error(IoStatus::Failed(libc::EROFS)), EPERM);
        assert_eq!(nbd_error(IoStatus::nvme(0, 0x20)), EPERM);
        assert_eq!(nbd_error(IoStatus::nvme(2, 0x81)), EIO);
        assert_eq!(nbd_error(IoStatus::Failed(libc::EIO)), EIO);
    }
}
