//! One host queue pair: a TCP connection to a controller, owned by one reactor.
//!
//! As on the target, a reader task decodes PDUs (ICResp, response capsules, C2HData placed
//! straight into the request's buffers, R2Ts answered with H2CData from the request's buffers)
//! and a writer task sends what is queued in one `sendmsg`. A command's slot is its CID. A
//! command whose data is still being sent is not completed (and its buffers not released)
//! before the send is done, whatever the controller answers.
//!
//! The connection is built on the target kit (`ferrite_target`), as the targets' are: its
//! core (socket, closing and dead flags, the writer's waker), its command slots, its
//! commands' phases, and its two ends: a graceful close that drains the outstanding commands
//! first, and a forced one that fails each of them exactly once. What it shares with the
//! iSCSI initiator is the kit's `host` module: a command's phase that waits for the send of
//! its data (`Flight`), the writer loop, and C2HData placed into the request's buffers.

use ferrite_bdev::{BdevIo, IoStatus};
use ferrite_nvme::spec::cqe::Cqe;
use ferrite_nvme::spec::fabrics::{cattr, ConnectCommand, ConnectData, ConnectSuccess};
use ferrite_nvme::spec::nqn::NqnField;
use ferrite_nvme::spec::sgl::SglDescriptor;
use ferrite_nvme::spec::sqe::Sqe;
use ferrite_nvme::spec::status::Status;
use ferrite_nvme::tcp::encoder::MAX_HEAD_LEN;
use ferrite_nvme::tcp::{encode, host_accept, Decoder, Event, IcReq, Negotiated, Pdu, Role, Want};
use ferrite_reactor::net::Socket;
use ferrite_reactor::{oneshot, IoBuf};
use ferrite_target::host::{place, write_loop, Flight, HostPhase, Outgoing, Reads, Stop};
use ferrite_target::rx::Rx;
use ferrite_target::{ConnCore, SlotTable};
use smallvec::SmallVec;
use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub(crate) use ferrite_target::host::with_deadline;

/// Queue pair IDs (the kit's connection IDs), unique in the process.
static NEXT_QPAIR: AtomicU64 = AtomicU64::new(1);

/// What a connection needs to know to Connect.
#[derive(Debug, Clone)]
pub struct ConnectParams {
    /// The controller's address.
    pub addr: std::net::SocketAddr,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Host NQN.
    pub hostnqn: String,
    /// Host identifier.
    pub hostid: [u8; 16],
    /// Queue ID (0: admin).
    pub qid: u16,
    /// Queue entries.
    pub entries: u16,
    /// Controller ID (FFFFh on the admin queue).
    pub cntlid: u16,
    /// Keep-alive timeout (admin queue), ms.
    pub kato_ms: u32,
    /// Ask for header digests.
    pub hdgst: bool,
    /// Ask for data digests.
    pub ddgst: bool,
    /// Ask the controller to disable SQ flow control (Connect CATTR bit 2): it then need not
    /// report SQ head pointers and may answer a successful read with its data alone (C2HData
    /// SUCCESS), one PDU instead of two. The host never reads SQHD either way: it keeps at
    /// most `entries - 1` commands outstanding.
    pub disable_sqflow: bool,
    /// Time allowed for the TCP connect, ICReq and Connect.
    pub timeout: Duration,
}

/// An admin or Fabrics command's answer.
#[derive(Debug)]
pub struct Reply {
    /// The completion.
    pub cqe: Cqe,
    /// Data the controller returned.
    pub data: Vec<u8>,
    /// Why the connection ended under the command, when `cqe` is the made-up completion of
    /// that end (a host path error) and not the controller's answer: what the controller did
    /// wrong, or that the connection closed.
    pub closed: Option<String>,
}

/// Who waits for a command: a bdev request, or a caller of an admin or Fabrics command (the
/// kit's).
pub type Owner = ferrite_target::host::Owner<Reply>;

#[derive(Default)]
struct Cmd {
    /// Where it stands, the PDUs carrying its data not yet sent, and the completion that
    /// arrived meanwhile (the kit's).
    flight: Flight<Cqe>,
    owner: Option<Owner>,
    /// Bytes of data the command moves.
    len: u32,
    /// Controller-to-host.
    read: bool,
    /// Extra data the command sends (a DSM range list), kept until it completes.
    extra: Option<IoBuf>,
    /// Bytes of a read's data received (a read that completes without all of them fails:
    /// its buffers would hand out whatever they held before).
    got: u32,
    /// The status the command fails with whatever the controller answers (its data failed its
    /// digest); it still completes only with the controller's completion.
    failed: Option<Status>,
    /// The watchdog's tick it was sent in.
    tick: u32,
    /// The watchdog times it (not an Asynchronous Event Request, which waits for as long as
    /// nothing happens).
    watched: bool,
    /// The watchdog has reported it.
    timed_out: bool,
    /// How many commands the slot has started (wrapping): the high bits of its CID, so that a
    /// late or repeated completion of an earlier command in the slot names no command.
    gen: u16,
}

impl Cmd {
    /// Starts the slot's next command, sent in watchdog tick `tick`: everything a command
    /// leaves behind is reset here.
    fn begin(&mut self, owner: Owner, len: u32, read: bool, extra: Option<IoBuf>, tick: u32) {
        debug_assert!(self.owner.is_none(), "a free slot holds nothing");
        self.owner = Some(owner);
        self.tick = tick;
        self.watched = true;
        self.timed_out = false;
        self.len = len;
        self.read = read;
        self.extra = extra;
        self.got = 0;
        self.failed = None;
        self.gen = self.gen.wrapping_add(1);
    }
}

impl Reads for Cmd {
    fn read_bufs(&mut self) -> Option<&mut [IoBuf]> {
        self.owner.as_mut().and_then(Owner::read_bufs)
    }

    fn received(&mut self, n: u32) {
        self.got = self.got.saturating_add(n);
    }
}

struct Out {
    head: [u8; MAX_HEAD_LEN],
    head_len: u8,
    pieces: SmallVec<[(*const u8, usize); 2]>,
    ddgst: [u8; 4],
    has_ddgst: bool,
    /// The command whose data this PDU carries.
    slot: Option<u16>,
}

/// A connected queue pair.
pub struct HostQpair {
    /// Socket, controller's address, the flags of its end, the writer's waker (the kit's).
    core: ConnCore,
    params: Cell<Negotiated>,
    qid: u16,
    /// Most in-capsule data (0: none).
    pub(crate) icd_max: Cell<u32>,
    /// Commands by slot (a CID's low bits), at most `depth`.
    cmds: RefCell<SlotTable<Cmd>>,
    depth: u16,
    /// A CID's low bits: its slot; the bits above hold the slot's generation.
    slot_bits: u32,
    out: RefCell<Vec<Out>>,
    ic_wait: RefCell<Option<oneshot::Sender<Result<Negotiated, String>>>>,
    /// The ICReq sent (the ICResp is checked against it).
    ic_req: Cell<Option<IcReq>>,
    /// Tasks still running (reader, writer).
    tasks: Cell<u8>,
    /// Runs once when the queue pair fails or closes (after its commands were failed).
    on_close: RefCell<Option<Box<dyn FnOnce()>>>,
    /// Runs once at the first command that completes successfully (see [`HostQpair::on_success`]);
    /// `awaiting_success` says one is set, so that a completion tests a flag, nothing more.
    on_success: RefCell<Option<Box<dyn FnOnce()>>>,
    awaiting_success: Cell<bool>,
    /// The controller ID Connect returned.
    pub cntlid: Cell<u16>,
    /// Ticks of the watchdog ([`HostQpair::watch`]) so far: a command's age is counted in
    /// them, so that sending one reads no clock.
    tick: Cell<u32>,
    /// What the controller did wrong, if its protocol error ended the connection.
    fault: RefCell<Option<String>>,
}

/// A decoder error in words that say what the controller sent wrong.
fn violation(e: &ferrite_nvme::tcp::pdu::PduError) -> String {
    use ferrite_nvme::tcp::pdu::{offset, PduError, PduType, MIN_MAXH2CDATA};
    match e {
        PduError::InvalidField { pdu_type: PduType::IcResp, offset: offset::MAXH2CDATA, value } => {
            format!("invalid ICResp: MAXH2CDATA {value} (it must be at least {MIN_MAXH2CDATA} and a multiple of 4)")
        }
        PduError::InvalidField { pdu_type: PduType::IcResp, .. }
        | PduError::UnsupportedParameter { pdu_type: PduType::IcResp, .. } => format!("invalid ICResp: {e}"),
        _ => format!("invalid PDU: {e}"),
    }
}

/// What a queue pair's watchdog calls with a command that timed out (its CID).
pub type OnTimeout = Box<dyn Fn(&Rc<HostQpair>, u16)>;

impl HostQpair {
    /// Connects a queue pair (TCP, ICReq, Fabrics Connect). Runs on the reactor that will use it.
    pub async fn connect(p: &ConnectParams) -> Result<Rc<HostQpair>, String> {
        let deadline = Instant::now() + p.timeout;
        let sock = Socket::connect_by(p.addr, deadline).await.map_err(|e| format!("connect to {}: {e}", p.addr))?;
        ferrite_reactor::net::set_nodelay(sock.raw_fd());
        let depth = p.entries.saturating_sub(1).max(1);
        let id = NEXT_QPAIR.fetch_add(1, Ordering::Relaxed);
        let qp = Rc::new(HostQpair {
            core: ConnCore::new("nvme host qpair", id, sock, p.addr.to_string()),
            params: Cell::new(Negotiated::INITIAL),
            qid: p.qid,
            // The admin queue takes 8 KiB in capsules (NVMe/TCP); an I/O queue's Connect data
            // goes in its capsule too (every target takes that), and its own limit (IOCCSZ) is
            // set once it is connected.
            icd_max: Cell::new(if p.qid == 0 { 8192 } else { ConnectData::SIZE as u32 }),
            cmds: RefCell::new(SlotTable::default()),
            depth,
            slot_bits: u16::BITS - (depth - 1).leading_zeros(),
            out: RefCell::new(Vec::new()),
            ic_wait: RefCell::new(None),
            ic_req: Cell::new(None),
            tasks: Cell::new(2),
            on_close: RefCell::new(None),
            on_success: RefCell::new(None),
            awaiting_success: Cell::new(false),
            cntlid: Cell::new(0),
            tick: Cell::new(0),
            fault: RefCell::new(None),
        });
        let (tx, rx) = oneshot::channel();
        *qp.ic_wait.borrow_mut() = Some(tx);
        ferrite_reactor::spawn_local(reader(qp.clone())).detach();
        ferrite_reactor::spawn_local(writer(qp.clone())).detach();
        let ic = IcReq { pfv: 0, hpda: 0, hdgst: p.hdgst, ddgst: p.ddgst, maxr2t: 0 };
        qp.ic_req.set(Some(ic));
        let mut o = Out::new();
        match encode(&mut o.head, &Negotiated::INITIAL, &Pdu::IcReq(ic), &[]) {
            Ok(f) => o.head_len = f.head_len as u8,
            Err(e) => return Err(format!("ICReq: {e}")),
        }
        qp.push(o);
        let params = match with_deadline(rx, deadline).await {
            Some(Ok(Ok(n))) => n,
            Some(Ok(Err(e))) => {
                qp.close();
                return Err(e);
            }
            _ => {
                qp.close();
                return Err(format!("{}: no ICResp in time", p.addr));
            }
        };
        let _ = params;
        // Fabrics Connect with its 1 KiB of data in the capsule.
        let cmd = ConnectCommand {
            cid: 0,
            sgl1: SglDescriptor::in_capsule(0, ConnectData::SIZE as u32),
            recfmt: 0,
            qid: p.qid,
            sqsize: p.entries - 1,
            cattr: if p.disable_sqflow { cattr::DISABLE_SQ_FLOW_CONTROL } else { 0 },
            kato: p.kato_ms,
        };
        let data = ConnectData {
            hostid: p.hostid,
            cntlid: p.cntlid,
            subnqn: NqnField::new(&p.subnqn).map_err(|e| format!("subsystem NQN: {e}"))?,
            hostnqn: NqnField::new(&p.hostnqn).map_err(|e| format!("host NQN: {e}"))?,
        };
        let mut raw = [0u8; 64];
        cmd.encode(&mut raw);
        let mut buf = ferrite_reactor::alloc_buf(ConnectData::SIZE);
        buf.copy_from_slice(&data.to_bytes());
        let reply = with_deadline(qp.submit_wait(Sqe::decode(&raw), Some(buf), 0), deadline).await;
        let reply = match reply {
            Some(Ok(r)) => r,
            Some(Err(e)) => {
                qp.close();
                return Err(e);
            }
            None => {
                qp.close();
                return Err(format!("{}: no Connect response in time", p.addr));
            }
        };
        if let Some(why) = reply.closed {
            qp.close();
            return Err(format!("Connect to {} qid {}: {why}", p.subnqn, p.qid));
        }
        if !reply.cqe.status.is_success() {
            qp.close();
            return Err(format!(
                "Connect to {} qid {} refused: status sct {:#x} sc {:#x}",
                p.subnqn, p.qid, reply.cqe.status.sct, reply.cqe.status.sc
            ));
        }
        qp.cntlid.set(ConnectSuccess::from_dw0(reply.cqe.dw0).cntlid);
        Ok(qp)
    }

    /// Sets what runs when the queue pair fails or closes.
    pub fn on_close(&self, f: impl FnOnce() + 'static) {
        if self.core.is_dead() && self.tasks.get() == 0 {
            f();
        } else {
            *self.on_close.borrow_mut() = Some(Box::new(f));
        }
    }

    /// Runs `f` once, when a command on this queue pair next completes successfully (a
    /// controller's recovery proves itself by I/O that works).
    pub fn on_success(&self, f: impl FnOnce() + 'static) {
        *self.on_success.borrow_mut() = Some(Box::new(f));
        self.awaiting_success.set(true);
    }

    /// True once closed for good (or failed).
    pub fn is_closed(&self) -> bool {
        self.core.is_dead()
    }

    /// True once it sends no more commands: closing gracefully, or closed.
    pub fn is_closing(&self) -> bool {
        self.core.is_closing()
    }

    /// Commands outstanding (sent and not completed).
    pub fn outstanding(&self) -> usize {
        self.cmds.borrow().live()
    }

    /// The CID of the outstanding bdev request `named` picks.
    pub(crate) fn find_command(&self, named: &dyn Fn(&BdevIo) -> bool) -> Option<u16> {
        let cmds = self.cmds.borrow();
        let found = cmds
            .iter()
            .find(|(_, c)| c.flight.is_sent() && matches!(&c.owner, Some(Owner::Bdev(io)) if named(io)))
            .map(|(i, c)| self.cid_of(i as u16, c.gen));
        found
    }

    /// The CIDs of every outstanding command whose bdev request `named` picks.
    pub(crate) fn find_commands(&self, named: &dyn Fn(&BdevIo) -> bool) -> Vec<u16> {
        let cmds = self.cmds.borrow();
        cmds.iter()
            .filter(|(_, c)| c.flight.is_sent() && matches!(&c.owner, Some(Owner::Bdev(io)) if named(io)))
            .map(|(i, c)| self.cid_of(i as u16, c.gen))
            .collect()
    }

    /// True while command `cid` is outstanding and the watchdog has reported it.
    pub(crate) fn is_timed_out(&self, cid: u16) -> bool {
        let Some(slot) = self.slot_of(cid) else { return false };
        let cmds = self.cmds.borrow();
        cmds.get(u32::from(slot)).is_some_and(|c| c.timed_out)
    }

    /// The CID of the command in `slot` started as the slot's `gen`th: the slot in the low
    /// bits, as many bits of the generation as the rest holds above them (none for a queue
    /// of more than 32,768 entries).
    fn cid_of(&self, slot: u16, gen: u16) -> u16 {
        let gen = u32::from(gen).checked_shl(self.slot_bits).unwrap_or(0);
        (u32::from(slot) | gen) as u16
    }

    /// The slot of outstanding command `cid`: none if no command of the slot waits for its
    /// completion (none was sent, or it was answered already), or the CID names an earlier one.
    fn slot_of(&self, cid: u16) -> Option<u16> {
        let slot = (u32::from(cid) & ((1u32 << self.slot_bits) - 1)) as u16;
        let cmds = self.cmds.borrow();
        let c = cmds.get(u32::from(slot))?;
        (c.flight.is_sent() && self.cid_of(slot, c.gen) == cid).then_some(slot)
    }

    /// Starts the queue pair's watchdog: each command outstanding for `limit` (a little more:
    /// up to an eighth, the watchdog's period) is given to `on_timeout` once, as SPDK's
    /// timeout callback. It ticks every `limit / 8` (at least 1 ms) while the queue pair
    /// lives; sending a command reads no clock.
    pub fn watch(self: &Rc<Self>, limit: Duration, on_timeout: OnTimeout) {
        let period = (limit / 8).max(Duration::from_millis(1));
        // A command sent in tick t has waited at least (ticks - 1) periods at tick t + ticks.
        let ticks = u32::try_from(limit.as_nanos().div_ceil(period.as_nanos())).unwrap_or(u32::MAX - 1) + 1;
        let me = Rc::downgrade(self);
        ferrite_reactor::spawn_local(async move {
            loop {
                if !sleep_while(period, || me.upgrade().is_some_and(|q| !q.is_closed())).await {
                    return;
                }
                let Some(qp) = me.upgrade() else { return };
                if qp.is_closed() {
                    return;
                }
                let now = qp.tick.get().wrapping_add(1);
                qp.tick.set(now);
                let late: SmallVec<[u16; 8]> = {
                    let mut cmds = qp.cmds.borrow_mut();
                    cmds.iter_mut()
                        .filter(|(_, c)| {
                            c.flight.is_sent() && c.watched && !c.timed_out && now.wrapping_sub(c.tick) >= ticks
                        })
                        .map(|(slot, c)| {
                            c.timed_out = true;
                            qp.cid_of(slot as u16, c.gen)
                        })
                        .collect()
                };
                for cid in late {
                    on_timeout(&qp, cid);
                }
            }
        })
        .detach();
    }

    /// Queue ID.
    pub fn qid(&self) -> u16 {
        self.qid
    }

    /// Closes the connection at once (a forced close): its outstanding commands fail, each
    /// exactly once, when its tasks have stopped (bdev requests with a host path error, which
    /// sends them again through their channels).
    pub fn close(&self) {
        self.core.close();
    }

    /// Closes the connection gracefully: it sends no more commands, waits until those
    /// outstanding have completed (an Asynchronous Event Request, which waits for as long as
    /// nothing happens, is not waited for) or until `limit`, then closes; what is left then
    /// fails as in [`HostQpair::close`]. True if nothing was left.
    pub async fn close_gracefully(&self, limit: Duration) -> bool {
        ferrite_target::close_gracefully(&self.core, || self.drained(), limit).await
    }

    /// True when no command it waits for is outstanding (Asynchronous Event Requests aside).
    fn drained(&self) -> bool {
        let cmds = self.cmds.borrow();
        cmds.live() == 0 || cmds.iter().all(|(_, c)| c.flight.phase() == HostPhase::Free || !c.watched)
    }

    fn push(&self, o: Out) {
        self.out.borrow_mut().push(o);
        self.core.wake_writer();
    }

    fn take_slot(&self) -> Option<u16> {
        let i = self.cmds.borrow_mut().take(usize::from(self.depth), Cmd::default)?;
        Some(i as u16)
    }

    /// Sends an admin or Fabrics command and waits for its completion. `out`: data to send;
    /// `in_len`: bytes of data to receive.
    pub async fn submit_wait(&self, mut sqe: Sqe, out: Option<IoBuf>, in_len: u32) -> Result<Reply, String> {
        let (tx, rx) = oneshot::channel();
        let inb = (in_len > 0).then(|| ferrite_reactor::alloc_buf(in_len as usize));
        let len = out.as_ref().map_or(in_len, |b| b.len() as u32);
        let read = out.is_none() && in_len > 0;
        if self.core.is_closing() {
            return Err("queue pair closed".into());
        }
        let Some(slot) = self.take_slot() else { return Err("queue full".into()) };
        let pieces: SmallVec<[(*const u8, usize); 2]> = out.iter().map(|b| (b.as_ptr(), b.len())).collect();
        {
            let mut cmds = self.cmds.borrow_mut();
            let c = &mut cmds[usize::from(slot)];
            c.flight.start(self.core.id, u32::from(slot));
            c.begin(Owner::Wait { tx, out, inb }, len, read, None, self.tick.get());
            c.watched = sqe.opcode != ferrite_nvme::spec::opcode::admin::ASYNC_EVENT_REQUEST || self.qid != 0;
            sqe.cid = self.cid_of(slot, c.gen);
        }
        self.send_capsule(slot, sqe, &pieces, len, read);
        match rx.await {
            Ok(r) => r,
            Err(_) => Err("queue pair closed".into()),
        }
    }

    /// Starts a bdev request as command `sqe` (its CID and SGL are set here); `extra` is data
    /// to send instead of the request's buffers (a DSM range list). Err gives the request
    /// back when the queue is full or closed.
    pub fn submit_io(&self, mut sqe: Sqe, io: BdevIo, read: bool, extra: Option<IoBuf>) -> Result<(), BdevIo> {
        if self.core.is_closing() {
            return Err(io);
        }
        let Some(slot) = self.take_slot() else { return Err(io) };
        let (pieces, len): (SmallVec<[(*const u8, usize); 2]>, u32) = match &extra {
            Some(b) => (smallvec::smallvec![(b.as_ptr(), b.len())], b.len() as u32),
            None if sqe.opcode & 3 == 0 => (SmallVec::new(), 0),
            None => {
                // A passthrough's length is its buffers' (it names no blocks).
                let len = if io.req.io_type == ferrite_bdev::IoType::NvmeIo {
                    io.req.bufs.iter().map(|b| b.len() as u64).sum()
                } else {
                    io.len_bytes()
                };
                (io.req.bufs.iter().map(|b| (b.as_ptr(), b.len())).collect(), len as u32)
            }
        };
        {
            let mut cmds = self.cmds.borrow_mut();
            let c = &mut cmds[usize::from(slot)];
            c.flight.start(self.core.id, u32::from(slot));
            c.begin(Owner::Bdev(io), len, read, extra, self.tick.get());
            sqe.cid = self.cid_of(slot, c.gen);
        }
        self.send_capsule(slot, sqe, if read { &[] } else { &pieces }, len, read);
        Ok(())
    }

    fn send_capsule(&self, slot: u16, mut sqe: Sqe, pieces: &[(*const u8, usize)], len: u32, read: bool) {
        let in_capsule = !read && len > 0 && len <= self.icd_max.get();
        sqe.dptr = ferrite_nvme::spec::sqe::DataPointer::Sgl(if in_capsule {
            SglDescriptor::in_capsule(0, len)
        } else {
            SglDescriptor::transport(len)
        });
        sqe.psdt = ferrite_nvme::spec::sqe::Psdt::SglMptrContiguous;
        let mut raw = [0u8; 64];
        sqe.encode(&mut raw);
        let mut o = Out::new();
        // SAFETY: the pieces point into buffers the command's slot owns until it completes,
        // which waits for this PDU to be sent (`in_send`).
        let data: SmallVec<[&[u8]; 2]> = if in_capsule {
            pieces.iter().map(|&(p, l)| unsafe { std::slice::from_raw_parts(p, l) }).collect()
        } else {
            SmallVec::new()
        };
        let pdu = Pdu::CapsuleCmd(ferrite_nvme::tcp::CapsuleCmd { sqe: raw });
        match encode(&mut o.head, &self.params.get(), &pdu, &data) {
            Ok(f) => {
                o.head_len = f.head_len as u8;
                if let Some(d) = f.data_digest {
                    o.ddgst = d;
                    o.has_ddgst = true;
                }
            }
            Err(e) => {
                log::warn!("nvme host: cannot frame a command: {e}");
                self.finish(slot, Cqe::new(sqe.cid, Status::generic(0x06)));
                return;
            }
        }
        if in_capsule {
            o.pieces = pieces.iter().copied().collect();
            o.slot = Some(slot);
            // The command's first PDU: the count is 0.
            let counted = self.cmds.borrow_mut()[usize::from(slot)].flight.queued();
            debug_assert!(counted);
        }
        self.push(o);
    }

    /// What is wrong with C2HData for command `slot` at byte `datao` for `datal` bytes, if
    /// anything: a read's data comes in order, each PDU where the last one ended (as SPDK's
    /// host checks too), and within the length the command asked for. A repeated or
    /// overlapping PDU would leave part of the buffer unwritten and still count as received,
    /// and that part holds whatever the buffer held before.
    fn c2h_wrong(&self, slot: u16, datao: u32, datal: u32) -> Option<String> {
        let cmds = self.cmds.borrow();
        let c = &cmds[usize::from(slot)];
        let end = u64::from(datao) + u64::from(datal);
        if !c.read {
            Some("data for a command that reads none".into())
        } else if end > u64::from(c.len) {
            Some(format!(
                "{datal} bytes at offset {datao}, past the {} bytes the command asked for (longer than asked)",
                c.len
            ))
        } else if datao != c.got {
            Some(format!(
                "{datal} bytes at offset {datao}, but the next data of the read starts at offset {} (repeated, overlapping or out of order)",
                c.got
            ))
        } else {
            None
        }
    }

    /// Answers an R2T: H2CData PDUs for the range, at most MAXH2CDATA each.
    fn answer_r2t(&self, r: ferrite_nvme::tcp::R2t) -> Result<(), String> {
        let slot = self.slot_of(r.cccid).ok_or_else(|| format!("R2T for CCCID {}, no command outstanding", r.cccid))?;
        let params = self.params.get();
        let pieces: SmallVec<[(*const u8, usize); 4]> = {
            let cmds = self.cmds.borrow();
            let c = cmds.get(u32::from(slot)).ok_or("R2T for an unknown command")?;
            if c.read || u64::from(r.r2to) + u64::from(r.r2tl) > u64::from(c.len) {
                return Err(format!("R2T (CCCID {}, R2TO {}, R2TL {}) outside its command", r.cccid, r.r2to, r.r2tl));
            }
            match (&c.extra, &c.owner) {
                (Some(b), _) => smallvec::smallvec![(b.as_ptr(), b.len())],
                (None, Some(Owner::Bdev(io))) => io.req.bufs.iter().map(|b| (b.as_ptr(), b.len())).collect(),
                (None, Some(Owner::Wait { out: Some(b), .. })) => smallvec::smallvec![(b.as_ptr(), b.len())],
                _ => return Err("R2T for a command without data".into()),
            }
        };
        let max = params.maxh2cdata.max(4096);
        let mut off = r.r2to;
        let end = r.r2to + r.r2tl;
        while off < end {
            let n = (end - off).min(max);
            let mut o = Out::new();
            // The pieces of [off, off + n) of the scatter list.
            let mut at = 0u32;
            for &(p, l) in &pieces {
                let (s, e) = (at, at + l as u32);
                at = e;
                let lo = s.max(off);
                let hi = e.min(off + n);
                if lo < hi {
                    // SAFETY: within the piece.
                    o.pieces.push((unsafe { p.add((lo - s) as usize) }, (hi - lo) as usize));
                }
            }
            // SAFETY: the pieces point into buffers the slot owns until the send is done.
            let data: SmallVec<[&[u8]; 4]> =
                o.pieces.iter().map(|&(p, l)| unsafe { std::slice::from_raw_parts(p, l) }).collect();
            let pdu = Pdu::H2cData(ferrite_nvme::tcp::H2cData {
                cccid: r.cccid,
                ttag: r.ttag,
                datao: off,
                datal: n,
                last: off + n == end,
            });
            let f = encode(&mut o.head, &params, &pdu, &data).map_err(|e| format!("H2CData: {e}"))?;
            o.head_len = f.head_len as u8;
            if let Some(d) = f.data_digest {
                o.ddgst = d;
                o.has_ddgst = true;
            }
            o.slot = Some(slot);
            if !self.cmds.borrow_mut()[usize::from(slot)].flight.queued() {
                return Err("too many H2CData PDUs queued for one command".into());
            }
            self.push(o);
            off += n;
        }
        Ok(())
    }

    /// A completion arrived for `slot` (or the queue pair failed: a made-up one).
    fn finish(&self, slot: u16, mut cqe: Cqe) {
        let owner = {
            let mut cmds = self.cmds.borrow_mut();
            let Some(c) = cmds.get_mut(u32::from(slot)) else { return };
            if c.flight.phase() == HostPhase::Free {
                return;
            }
            if let Some(st) = c.failed {
                cqe.status = st;
            }
            if cqe.status.is_success() && c.read && c.got < c.len {
                log::warn!(
                    "nvme host qpair {}: command {slot} completed with {} of its {} data bytes",
                    self.qid,
                    c.got,
                    c.len
                );
                cqe.status = Status::generic(ferrite_nvme::spec::status::generic::DATA_TRANSFER_ERROR);
            }
            // Its data may still be with the kernel: then it completes when the send is done.
            let Some(answer) = c.flight.answer(cqe, self.core.id, u32::from(slot)) else { return };
            cqe = answer;
            c.extra = None;
            let owner = c.owner.take();
            cmds.release(u32::from(slot));
            owner
        };
        if self.core.is_closing() && self.drained() {
            // A graceful close waits for this.
            self.core.wake();
        }
        if self.awaiting_success.get() && cqe.status.is_success() {
            self.awaiting_success.set(false);
            if let Some(f) = self.on_success.borrow_mut().take() {
                f();
            }
        }
        match owner {
            Some(Owner::Bdev(io)) => bdev_done(io, &cqe),
            Some(Owner::Wait { tx, inb, .. }) => {
                let data = inb.map(|b| b.to_vec()).unwrap_or_default();
                let closed = connection_failed(&cqe).then(|| self.close_reason());
                tx.send(Ok(Reply { cqe, data, closed }));
            }
            None => {}
        }
    }

    /// A PDU carrying command `slot`'s data has been sent: the command completes now if its
    /// completion came meanwhile.
    fn sent(&self, slot: u16) {
        let done = self.cmds.borrow_mut()[usize::from(slot)].flight.sent();
        if let Some(cqe) = done {
            self.finish(slot, cqe);
        }
    }

    /// Data of command `slot` failed its digest: the command fails with Transient Transport
    /// Error, but keeps its slot (its CID) until the controller's completion for it, which is
    /// the response capsule, or this PDU itself if it carried SUCCESS. Completing it at once
    /// would let a later command reuse the CID and be completed by that response (a write
    /// acknowledged that the controller never did).
    fn data_digest_failed(&self, slot: u16, success: bool) {
        let status = Status::generic(ferrite_nvme::spec::status::generic::TRANSIENT_TRANSPORT_ERROR);
        if let Some(c) = self.cmds.borrow_mut().get_mut(u32::from(slot)) {
            if c.flight.is_sent() {
                c.failed = Some(status);
            }
        }
        if success {
            self.finish(slot, Cqe::new(slot, status));
        }
    }

    /// Fails every outstanding command, each once (the connection is gone, its tasks have
    /// stopped: nothing is being sent any more).
    fn fail_all(&self) {
        ferrite_target::end_all(&self.core, &self.cmds, |slot| {
            let slot = slot as u16;
            let mut cqe = Cqe::new(slot, Status::path(ferrite_nvme::spec::status::path::HOST_PATH_ERROR));
            cqe.dw0 = u32::MAX;
            self.cmds.borrow_mut()[usize::from(slot)].flight.sends_lost();
            self.finish(slot, cqe);
        });
    }

    /// Why the connection ended: the controller's protocol error, or that it closed.
    fn close_reason(&self) -> String {
        match &*self.fault.borrow() {
            Some(f) => format!("the controller broke the protocol: {f}"),
            None => "connection closed".into(),
        }
    }

    fn task_done(&self) {
        self.tasks.set(self.tasks.get() - 1);
        if self.tasks.get() == 0 {
            self.fail_all();
            if let Some(w) = self.ic_wait.borrow_mut().take() {
                w.send(Err(self.close_reason()));
            }
            if let Some(f) = self.on_close.borrow_mut().take() {
                f();
            }
        }
    }
}

impl Outgoing for Out {
    fn parts(&self, parts: &mut Vec<(*const u8, usize)>) {
        parts.push((self.head.as_ptr(), self.head_len as usize));
        parts.extend(self.pieces.iter().copied());
        if self.has_ddgst {
            parts.push((self.ddgst.as_ptr(), 4));
        }
    }

    fn slot(&self) -> Option<u16> {
        self.slot
    }
}

impl Out {
    fn new() -> Out {
        Out {
            head: [0; MAX_HEAD_LEN],
            head_len: 0,
            pieces: SmallVec::new(),
            ddgst: [0; 4],
            has_ddgst: false,
            slot: None,
        }
    }
}

/// Completes a bdev request, or, if it failed for a path reason (its connection dropped, an
/// ANA status), sends it again through its channel, which may choose another path.
fn bdev_done(mut io: BdevIo, cqe: &Cqe) {
    use ferrite_nvme::spec::log::ana_state;
    use ferrite_nvme::spec::status::{path, sct};
    let status = status_of(cqe);
    // The command's dword 0 travels beside its status, as SPDK's `cdw0` does.
    io.result = u64::from(cqe.dw0);
    let s = cqe.status;
    if s.sct != sct::PATH || s.sc == path::ABORTED_BY_HOST {
        return io.complete(status);
    }
    let ana = match s.sc {
        path::ASYMMETRIC_ACCESS_INACCESSIBLE => Some(ana_state::INACCESSIBLE),
        path::ASYMMETRIC_ACCESS_PERSISTENT_LOSS => Some(ana_state::PERSISTENT_LOSS),
        path::ASYMMETRIC_ACCESS_TRANSITION => Some(ana_state::CHANGE),
        _ => None,
    };
    if let Some(state) = ana {
        crate::channel::ana_failed(&io, state);
    }
    crate::channel::retry(io, status);
}

/// True for the completion a command gets when its connection failed or closed under it (not
/// an answer of the controller).
pub(crate) fn connection_failed(cqe: &Cqe) -> bool {
    use ferrite_nvme::spec::status::{path, sct};
    cqe.status.sct == sct::PATH && cqe.status.sc == path::HOST_PATH_ERROR && cqe.dw0 == u32::MAX
}

/// A bdev status for a completion: the layer's own for an abort and a compare failure (as
/// SPDK's `spdk_bdev_io_set_nvme_status` and bdev_nvme do), the controller's whole otherwise,
/// Do Not Retry and More included.
fn status_of(cqe: &Cqe) -> IoStatus {
    use ferrite_nvme::spec::status::{generic, media, sct};
    let s = cqe.status;
    if s.is_success() {
        IoStatus::Success
    } else if s.sct == sct::GENERIC && s.sc == generic::ABORTED_BY_REQUEST {
        IoStatus::Aborted
    } else if s.sct == sct::MEDIA_ERROR && s.sc == media::COMPARE_FAILURE {
        IoStatus::MISCOMPARE
    } else if connection_failed(cqe) {
        IoStatus::Failed(libc::EIO)
    } else {
        IoStatus::Nvme { sct: s.sct, sc: s.sc, dnr: s.dnr, more: s.more }
    }
}

/// Sleeps `period` in steps of at most a minute, as long as `alive` holds; false if it stopped
/// holding (a timer of hours does not keep what it serves for its whole period; periods of the
/// usual seconds take one timer, as a timer costs an allocation).
pub(crate) async fn sleep_while(period: Duration, alive: impl Fn() -> bool) -> bool {
    let mut left = period;
    while !left.is_zero() {
        let step = left.min(Duration::from_secs(60));
        ferrite_reactor::sleep(step).await;
        if !alive() {
            return false;
        }
        left -= step;
    }
    true
}

async fn writer(qp: Rc<HostQpair>) {
    // SAFETY: heads and digests are inside the entries; data pieces point into buffers their
    // commands' slots keep until the kit's `Flight` has counted their sends (`sent`).
    let res = unsafe { write_loop(&qp.core, &qp.out, |slot| qp.sent(slot)) }.await;
    if let Err(e) = res {
        log::info!("nvme host qpair {}: send failed: {e}", qp.qid);
        qp.close();
    }
    qp.out.borrow_mut().clear();
    qp.task_done();
}

/// Where received data goes.
enum Dest {
    Skip,
    /// Command `slot`'s read buffers from byte `at`.
    Cmd {
        slot: u16,
        at: u32,
        success: bool,
    },
}

async fn reader(qp: Rc<HostQpair>) {
    match read_loop(&qp).await {
        Ok(()) => {}
        Err(Stop::Violation(e)) => {
            // The controller's fault, not a network's: said at WARN, in words that name it.
            log::warn!(
                "nvme host qpair {} to {}: protocol error by the controller: {e}; closing the connection",
                qp.qid,
                qp.core.peer
            );
            *qp.fault.borrow_mut() = Some(e);
        }
        Err(Stop::Closed(e)) => {
            if !qp.is_closed() {
                log::info!("nvme host qpair {} to {}: {e}", qp.qid, qp.core.peer);
            }
        }
    }
    qp.close();
    qp.task_done();
}

async fn read_loop(qp: &Rc<HostQpair>) -> Result<(), Stop> {
    let mut rx = Rx::new(&qp.core.sock);
    let mut dec = Decoder::new(Role::Host);
    let mut dest = Dest::Skip;
    loop {
        if qp.is_closed() {
            return Ok(());
        }
        match dec.want() {
            Want::Closed => return Err(Stop::Closed("decoder stopped".into())),
            Want::Bytes(_) => {
                let chunk = rx.chunk().await.map_err(Stop::Closed)?;
                let fed = dec.feed(chunk).map_err(|e| Stop::Violation(violation(&e)))?;
                chunk.consume(fed.consumed);
                match fed.event {
                    None => {}
                    Some(Event::Header(h)) => match h.pdu {
                        Pdu::IcResp(resp) => {
                            let req = qp.ic_req.get().ok_or(Stop::Violation("ICResp without an ICReq".into()))?;
                            let n = host_accept(&req, &resp).map_err(|e| Stop::Violation(violation(&e)))?;
                            dec.set_params(n);
                            qp.params.set(n);
                            if let Some(w) = qp.ic_wait.borrow_mut().take() {
                                w.send(Ok(n));
                            }
                        }
                        Pdu::CapsuleResp(r) => {
                            let cqe = Cqe::decode(&r.cqe);
                            // A completion of no outstanding command (repeated, late, or of
                            // a CID never sent) is the controller's error: completing the
                            // slot's current command with it could acknowledge a write the
                            // controller never did. The connection is dropped, as Linux's
                            // host does; its commands are sent again after reconnecting.
                            let Some(slot) = qp.slot_of(cqe.cid) else {
                                return Err(Stop::Violation(format!(
                                    "a completion for CID {}, which names no outstanding command (repeated, late or never sent)",
                                    cqe.cid
                                )));
                            };
                            qp.finish(slot, cqe);
                        }
                        Pdu::C2hData(d) => {
                            // In order and within the read (`c2h_wrong`), or the controller's error.
                            let slot = qp.slot_of(d.cccid).ok_or_else(|| {
                                Stop::Violation(format!(
                                    "C2HData for CCCID {}, which names no outstanding command",
                                    d.cccid
                                ))
                            })?;
                            if let Some(wrong) = qp.c2h_wrong(slot, d.datao, d.datal) {
                                return Err(Stop::Violation(format!("C2HData for CCCID {}: {wrong}", d.cccid)));
                            }
                            dest = Dest::Cmd { slot, at: d.datao, success: d.success };
                        }
                        Pdu::R2t(r) => qp.answer_r2t(r).map_err(Stop::Violation)?,
                        Pdu::C2hTermReq(t) => {
                            return Err(Stop::Violation(format!(
                                "C2HTermReq (the controller ended the connection: FES {:#x}, FEI {:#x})",
                                t.fes, t.fei
                            )))
                        }
                        other => {
                            return Err(Stop::Violation(format!(
                                "{}, a PDU a controller does not send",
                                other.pdu_type()
                            )))
                        }
                    },
                    Some(Event::DataEnd) => {
                        if let Dest::Cmd { slot, success: true, .. } = dest {
                            qp.finish(slot, Cqe::new(slot, Status::SUCCESS));
                        }
                        dest = Dest::Skip;
                    }
                    Some(Event::DataDigestError { .. }) => {
                        if let Dest::Cmd { slot, success, .. } = dest {
                            qp.data_digest_failed(slot, success);
                        }
                        dest = Dest::Skip;
                    }
                }
            }
            Want::Data(left) => {
                let left = left as usize;
                match dest {
                    Dest::Skip => {
                        let chunk = rx.chunk().await.map_err(Stop::Closed)?;
                        let k = chunk.len().min(left);
                        let fed = dec.data(&chunk[..k]);
                        chunk.consume(fed.consumed);
                    }
                    Dest::Cmd { slot, at, success } => {
                        let fed = place(&qp.cmds, u32::from(slot), &mut rx, at, left, "C2HData", |d| dec.data(d).event)
                            .await?;
                        dest = Dest::Cmd { slot, at: at + left as u32, success };
                        match fed {
                            Some(Event::DataEnd) => {
                                if success {
                                    qp.finish(slot, Cqe::new(slot, Status::SUCCESS));
                                }
                                dest = Dest::Skip;
                            }
                            Some(Event::DataDigestError { .. }) => {
                                qp.data_digest_failed(slot, success);
                                dest = Dest::Skip;
                            }
                            _ => {}
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_nvme::spec::status::Status;

    fn cqe(status: Status, dw0: u32) -> Cqe {
        Cqe { dw0, dw1: 0, sqhd: 0, sqid: 1, cid: 7, phase: true, status }
    }

    #[test]
    fn a_controller_status_reaches_the_bdev_whole() {
        let s = Status { sct: 0, sc: 0x81, crd: 0, more: true, dnr: true };
        assert_eq!(status_of(&cqe(s, 5)), IoStatus::Nvme { sct: 0, sc: 0x81, dnr: true, more: true });
        let s = Status::new(2, 0x81);
        assert_eq!(status_of(&cqe(s, 0)), IoStatus::nvme(2, 0x81), "no DNR where the controller set none");
        assert_eq!(status_of(&cqe(Status::media(0x85).with_dnr(), 0)), IoStatus::MISCOMPARE);
        assert_eq!(status_of(&cqe(Status::generic(0x07), 0)), IoStatus::Aborted);
        assert_eq!(status_of(&cqe(Status::SUCCESS, 9)), IoStatus::Success);
    }
}
