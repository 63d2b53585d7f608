//! A remote controller: its admin queue on the first reactor (initialization, identify,
//! keep-alive, reconnection), one I/O queue pair per reactor made when a channel there first
//! submits, and a bdev per namespace.

use crate::qpair::{ConnectParams, HostQpair, Reply};
use ferrite_bdev::{BdevIo, IoStatus};
use ferrite_nvmf::spec::identify::{cns, NamespaceList};
use ferrite_nvmf::spec::identify_ctrl::IdentifyController;
use ferrite_nvmf::spec::identify_ns::IdentifyNamespace;
use ferrite_nvmf::spec::opcode::admin as op;
use ferrite_nvmf::spec::registers::{self, Cc, Csts};
use ferrite_nvmf::spec::sqe::Sqe;
use ferrite_reactor::IoBuf;
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What `bdev_nvme_attach_controller` asked for.
#[derive(Debug, Clone)]
pub struct AttachOpts {
    /// Controller name (bdevs are `<name>n<nsid>`).
    pub name: String,
    /// "IPv4" or "IPv6".
    pub adrfam: String,
    /// Address.
    pub traddr: String,
    /// Port.
    pub trsvcid: String,
    /// Subsystem NQN.
    pub subnqn: String,
    /// Host NQN.
    pub hostnqn: String,
    /// Header digests.
    pub hdgst: bool,
    /// Data digests.
    pub ddgst: bool,
    /// Seconds to keep reconnecting after the controller is lost (-1: for ever; 0: never).
    pub ctrlr_loss_timeout_sec: i64,
    /// Seconds between reconnection attempts.
    pub reconnect_delay_sec: u64,
    /// Seconds after which I/O waiting for a lost controller fails (0: at the loss timeout).
    pub fast_io_fail_timeout_sec: u64,
    /// I/O queue entries.
    pub io_queue_size: u16,
    /// Keep-alive timeout in ms.
    pub kato_ms: u32,
}

impl AttachOpts {
    fn socket_addr(&self) -> Result<std::net::SocketAddr, String> {
        let s = if self.adrfam.eq_ignore_ascii_case("ipv6") {
            format!("[{}]:{}", self.traddr, self.trsvcid)
        } else {
            format!("{}:{}", self.traddr, self.trsvcid)
        };
        s.parse().map_err(|e| format!("address {s}: {e}"))
    }
}

/// A namespace as identified.
#[derive(Debug, Clone)]
pub struct NsInfo {
    /// NSID.
    pub nsid: u32,
    /// Block size.
    pub block_size: u32,
    /// Blocks.
    pub num_blocks: u64,
    /// NGUID.
    pub nguid: [u8; 16],
}

/// What identify told.
#[derive(Debug, Clone, Default)]
pub struct CtrlrInfo {
    /// Serial number.
    pub sn: String,
    /// Model number.
    pub mn: String,
    /// Firmware revision.
    pub fr: String,
    /// Largest transfer in bytes (0: no limit).
    pub max_xfer: u32,
    /// Optional NVM commands (ONCS).
    pub oncs: u16,
    /// In-capsule data an I/O command may carry.
    pub icd_max: u32,
}

/// A remote controller.
pub struct HostCtrlr {
    /// Unique ID in the process.
    pub id: u64,
    /// Options.
    pub opts: AttachOpts,
    addr: std::net::SocketAddr,
    hostid: [u8; 16],
    /// Current controller ID.
    pub cntlid: AtomicU16,
    /// Identify results.
    pub info: Mutex<CtrlrInfo>,
    /// Detached: everything stops.
    pub detached: AtomicBool,
    /// The admin queue is lost and being reconnected.
    pub resetting: AtomicBool,
    /// Given up on: lost past `ctrlr_loss_timeout_sec` (I/O fails; detach it).
    pub failed: AtomicBool,
    /// Bumped at each successful (re)connection of the admin queue.
    pub generation: AtomicU64,
    /// Time the controller was lost (ns since the Unix epoch; 0 while connected).
    lost_at: AtomicU64,
    /// Engine the controller lives in.
    engine: ferrite_reactor::Engine,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

ferrite_reactor::reactor_local! {
    /// Admin queue pairs by controller ID (on the first reactor).
    static ADMIN: RefCell<HashMap<u64, Rc<HostQpair>>> = RefCell::new(HashMap::new());
}

ferrite_reactor::reactor_local! {
    /// This reactor's I/O paths by controller ID.
    static PATHS: RefCell<HashMap<u64, Rc<IoPath>>> = RefCell::new(HashMap::new());
}

fn now_ns() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(ferrite_nvmf::spec::identify_ctrl::field_text(b)).trim().to_string()
}

impl HostCtrlr {
    fn params(&self, qid: u16, entries: u16, cntlid: u16) -> ConnectParams {
        ConnectParams {
            addr: self.addr,
            subnqn: self.opts.subnqn.clone(),
            hostnqn: self.opts.hostnqn.clone(),
            hostid: self.hostid,
            qid,
            entries,
            cntlid,
            kato_ms: if qid == 0 { self.opts.kato_ms } else { 0 },
            hdgst: self.opts.hdgst,
            ddgst: self.opts.ddgst,
            timeout: Duration::from_secs(10),
        }
    }

    /// Connects (or reconnects) the admin queue and brings the controller up: CC.EN, CSTS.RDY,
    /// identify, number of queues. Returns the namespaces. Runs on the first reactor.
    async fn bring_up(self: &Arc<Self>) -> Result<Vec<NsInfo>, String> {
        let admin = HostQpair::connect(&self.params(0, 32, 0xffff)).await?;
        let cntlid = admin.cntlid.get();
        let result = self.init_admin(&admin).await;
        match result {
            Ok(ns) => {
                self.cntlid.store(cntlid, Ordering::Release);
                ADMIN.with(|a| a.borrow_mut().insert(self.id, admin.clone()));
                let me = self.clone();
                let gen = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
                admin.on_close(move || me.admin_lost(gen));
                Ok(ns)
            }
            Err(e) => {
                admin.close();
                Err(e)
            }
        }
    }

    async fn init_admin(self: &Arc<Self>, admin: &Rc<HostQpair>) -> Result<Vec<NsInfo>, String> {
        let cap = prop_get(admin, registers::offset::CAP, 8).await?;
        let timeout_ms = ((cap >> 24) & 0xff).max(1) * 500;
        let cc = Cc { en: true, iosqes: 6, iocqes: 4, ..Cc::default() };
        prop_set(admin, registers::offset::CC, cc.to_u32()).await?;
        let deadline = Instant::now() + Duration::from_millis(timeout_ms.min(30_000));
        loop {
            let csts = Csts::from_u32(prop_get(admin, registers::offset::CSTS, 4).await? as u32);
            if csts.rdy {
                break;
            }
            if Instant::now() > deadline {
                return Err("the controller did not become ready".into());
            }
            ferrite_reactor::sleep(Duration::from_millis(10)).await;
        }
        let id = identify(admin, cns::CONTROLLER, 0).await?;
        let ctrl = IdentifyController::decode(id.as_slice().try_into().map_err(|_| "short identify")?);
        let max_xfer = if ctrl.mdts == 0 { 0 } else { 4096u32.saturating_mul(1 << ctrl.mdts.min(20)) };
        let icd_max = (ctrl.ioccsz.saturating_mul(16)).saturating_sub(64);
        *self.info.lock().unwrap() = CtrlrInfo {
            sn: text(&ctrl.sn),
            mn: text(&ctrl.mn),
            fr: text(&ctrl.fr),
            max_xfer,
            oncs: ctrl.oncs,
            icd_max,
        };
        // Number of queues: one I/O queue per reactor.
        let n = self.engine.count() as u32;
        let mut sqe = Sqe::new(op::SET_FEATURES, 0, 0);
        sqe.cdw10 = u32::from(ferrite_nvmf::spec::features::fid::NUMBER_OF_QUEUES);
        sqe.cdw11 = (n - 1) | (n - 1) << 16;
        let r = admin.submit_wait(sqe, None, 0).await?;
        check(&r, "Set Features Number of Queues")?;
        let list = identify(admin, cns::ACTIVE_NS_LIST, 0).await?;
        let list = NamespaceList::decode(list.as_slice().try_into().map_err(|_| "short identify")?);
        let mut out = Vec::new();
        for nsid in list.iter() {
            let d = identify(admin, cns::NAMESPACE, nsid).await?;
            let ns = IdentifyNamespace::decode(d.as_slice().try_into().map_err(|_| "short identify")?);
            let Some(bs) = ns.current_format().block_size() else { continue };
            if ns.nsze == 0 {
                continue;
            }
            out.push(NsInfo { nsid, block_size: bs, num_blocks: ns.nsze, nguid: ns.nguid });
        }
        Ok(out)
    }

    /// The admin queue of generation `gen` closed: unless detached, reconnect it (every
    /// `reconnect_delay_sec`, until `ctrlr_loss_timeout_sec`), and keep-alive resumes.
    fn admin_lost(self: &Arc<Self>, gen: u64) {
        if self.detached.load(Ordering::Acquire) || self.generation.load(Ordering::Acquire) != gen {
            return;
        }
        ADMIN.with(|a| a.borrow_mut().remove(&self.id));
        self.resetting.store(true, Ordering::Release);
        let _ = self.lost_at.compare_exchange(0, now_ns(), Ordering::AcqRel, Ordering::Acquire);
        log::warn!("nvme controller {}: admin queue lost; reconnecting", self.opts.name);
        let me = self.clone();
        ferrite_reactor::spawn_local(async move {
            loop {
                if me.detached.load(Ordering::Acquire) {
                    return;
                }
                if me.loss_timed_out() {
                    log::warn!("nvme controller {}: ctrlr_loss_timeout_sec passed; giving up", me.opts.name);
                    me.failed.store(true, Ordering::Release);
                    me.fail_paths();
                    return;
                }
                ferrite_reactor::sleep(Duration::from_secs(me.opts.reconnect_delay_sec.max(1))).await;
                match me.bring_up().await {
                    Ok(_) => {
                        me.resetting.store(false, Ordering::Release);
                        me.lost_at.store(0, Ordering::Release);
                        log::info!(
                            "nvme controller {}: reconnected (cntlid {})",
                            me.opts.name,
                            me.cntlid.load(Ordering::Relaxed)
                        );
                        // The I/O paths reconnect with the new controller ID.
                        let id = me.id;
                        me.engine.on_all(move |_| kick_path(id));
                        return;
                    }
                    Err(e) => log::info!("nvme controller {}: reconnect failed: {e}", me.opts.name),
                }
            }
        })
        .detach();
    }

    /// True once the loss timeout has passed since the controller was lost.
    pub fn loss_timed_out(&self) -> bool {
        let t = self.opts.ctrlr_loss_timeout_sec;
        let lost = self.lost_at.load(Ordering::Acquire);
        if lost == 0 || t < 0 {
            return false;
        }
        now_ns().saturating_sub(lost) >= (t as u64) * 1_000_000_000
    }

    /// True once waiting I/O should fail (fast_io_fail_timeout or the loss timeout).
    fn io_fail_due(&self) -> bool {
        let lost = self.lost_at.load(Ordering::Acquire);
        if lost == 0 {
            return false;
        }
        let f = self.opts.fast_io_fail_timeout_sec;
        (f > 0 && now_ns().saturating_sub(lost) >= f * 1_000_000_000) || self.loss_timed_out()
    }

    fn fail_paths(&self) {
        let id = self.id;
        self.engine.on_all(move |_| {
            if let Some(p) = PATHS.with(|p| p.borrow().get(&id).cloned()) {
                p.fail_waiting();
            }
        });
    }

    /// Starts the keep-alive task (first reactor).
    fn keep_alive(self: &Arc<Self>) {
        let me = self.clone();
        let period = Duration::from_millis(u64::from(self.opts.kato_ms / 2).max(500));
        ferrite_reactor::spawn_local(async move {
            loop {
                ferrite_reactor::sleep(period).await;
                if me.detached.load(Ordering::Acquire) {
                    return;
                }
                let Some(admin) = ADMIN.with(|a| a.borrow().get(&me.id).cloned()) else { continue };
                let sqe = Sqe::new(op::KEEP_ALIVE, 0, 0);
                if let Err(e) = admin.submit_wait(sqe, None, 0).await {
                    log::info!("nvme controller {}: keep-alive: {e}", me.opts.name);
                }
            }
        })
        .detach();
    }

    /// This reactor's I/O path to the controller.
    pub(crate) fn path(self: &Arc<Self>) -> Rc<IoPath> {
        PATHS.with(|p| {
            p.borrow_mut()
                .entry(self.id)
                .or_insert_with(|| {
                    Rc::new(IoPath {
                        ctrlr: self.clone(),
                        qp: RefCell::new(None),
                        waiting: RefCell::new(VecDeque::new()),
                        connecting: Cell::new(false),
                    })
                })
                .clone()
        })
    }
}

fn kick_path(id: u64) {
    if let Some(p) = PATHS.with(|p| p.borrow().get(&id).cloned()) {
        if !p.waiting.borrow().is_empty() {
            p.connect();
        }
    }
}

fn check(r: &Reply, what: &str) -> Result<(), String> {
    if r.cqe.status.is_success() {
        Ok(())
    } else {
        Err(format!("{what}: status sct {:#x} sc {:#x}", r.cqe.status.sct, r.cqe.status.sc))
    }
}

async fn prop_get(admin: &HostQpair, ofst: u32, size: u8) -> Result<u64, String> {
    let c = ferrite_nvmf::spec::fabrics::PropertyGetCommand {
        cid: 0,
        size: if size == 8 {
            ferrite_nvmf::spec::fabrics::PROPERTY_SIZE_8
        } else {
            ferrite_nvmf::spec::fabrics::PROPERTY_SIZE_4
        },
        ofst,
    };
    let mut raw = [0u8; 64];
    c.encode(&mut raw);
    let r = admin.submit_wait(Sqe::decode(&raw), None, 0).await?;
    check(&r, "Property Get")?;
    Ok(r.cqe.result_u64())
}

async fn prop_set(admin: &HostQpair, ofst: u32, value: u32) -> Result<(), String> {
    let c = ferrite_nvmf::spec::fabrics::PropertySetCommand {
        cid: 0,
        size: ferrite_nvmf::spec::fabrics::PROPERTY_SIZE_4,
        ofst,
        value: u64::from(value),
    };
    let mut raw = [0u8; 64];
    c.encode(&mut raw);
    let r = admin.submit_wait(Sqe::decode(&raw), None, 0).await?;
    check(&r, "Property Set")
}

async fn identify(admin: &HostQpair, cns_v: u8, nsid: u32) -> Result<Vec<u8>, String> {
    let mut sqe = Sqe::new(op::IDENTIFY, 0, nsid);
    sqe.cdw10 = u32::from(cns_v);
    let r = admin.submit_wait(sqe, None, 4096).await?;
    check(&r, "Identify")?;
    if r.data.len() < 4096 {
        return Err("Identify returned less than 4 KiB".into());
    }
    Ok(r.data)
}

/// A request waiting for the I/O queue pair.
struct Waiting {
    sqe: Sqe,
    io: BdevIo,
    read: bool,
    extra: Option<IoBuf>,
}

/// One reactor's way to a controller: its I/O queue pair, and requests waiting for it.
pub(crate) struct IoPath {
    ctrlr: Arc<HostCtrlr>,
    qp: RefCell<Option<Rc<HostQpair>>>,
    waiting: RefCell<VecDeque<Waiting>>,
    connecting: Cell<bool>,
}

impl IoPath {
    /// Sends a request, or keeps it until the queue pair is connected. Called from a channel's
    /// submit: completes only deferred.
    pub(crate) fn submit(self: &Rc<Self>, sqe: Sqe, io: BdevIo, read: bool, extra: Option<IoBuf>) {
        if self.ctrlr.detached.load(Ordering::Acquire) {
            return io.complete_deferred(IoStatus::Removed);
        }
        let qp = self.qp.borrow().clone();
        if let Some(qp) = qp.filter(|q| !q.is_closed()) {
            if let Err(io) = qp.submit_io(sqe, io, read, extra) {
                // The queue is full: the bdev layer retries when something completes.
                io.complete_deferred(IoStatus::NoMem);
            }
            return;
        }
        if self.ctrlr.io_fail_due() {
            return io.complete_deferred(IoStatus::Failed(libc::EIO));
        }
        self.waiting.borrow_mut().push_back(Waiting { sqe, io, read, extra });
        self.connect();
    }

    /// Connects the queue pair unless connecting; sends what waits once connected.
    fn connect(self: &Rc<Self>) {
        if self.connecting.replace(true) {
            return;
        }
        let me = self.clone();
        ferrite_reactor::spawn_local(async move {
            loop {
                let c = &me.ctrlr;
                if c.detached.load(Ordering::Acquire) {
                    me.fail_waiting();
                    break;
                }
                if !c.resetting.load(Ordering::Acquire) {
                    let qid = ferrite_reactor::current().unwrap_or(0) as u16 + 1;
                    let params = c.params(qid, c.opts.io_queue_size, c.cntlid.load(Ordering::Acquire));
                    match HostQpair::connect(&params).await {
                        Ok(qp) => {
                            qp.icd_max.set(c.info.lock().unwrap().icd_max);
                            let path = me.clone();
                            let q2 = Rc::downgrade(&qp);
                            qp.on_close(move || {
                                let mut cur = path.qp.borrow_mut();
                                if cur.as_ref().is_some_and(|q| q2.upgrade().is_some_and(|x| Rc::ptr_eq(q, &x))) {
                                    *cur = None;
                                }
                            });
                            *me.qp.borrow_mut() = Some(qp.clone());
                            let waiting: Vec<Waiting> = me.waiting.borrow_mut().drain(..).collect();
                            for w in waiting {
                                if let Err(io) = qp.submit_io(w.sqe, w.io, w.read, w.extra) {
                                    io.complete(IoStatus::NoMem);
                                }
                            }
                            break;
                        }
                        Err(e) => log::info!("nvme controller {}: I/O queue {qid}: {e}", c.opts.name),
                    }
                }
                if c.io_fail_due() || c.opts.ctrlr_loss_timeout_sec == 0 && !c.resetting.load(Ordering::Acquire) {
                    me.fail_waiting();
                    break;
                }
                ferrite_reactor::sleep(Duration::from_secs(c.opts.reconnect_delay_sec.max(1))).await;
                if me.waiting.borrow().is_empty() {
                    break;
                }
            }
            me.connecting.set(false);
        })
        .detach();
    }

    fn fail_waiting(&self) {
        let waiting: Vec<Waiting> = self.waiting.borrow_mut().drain(..).collect();
        for w in waiting {
            w.io.complete(IoStatus::Failed(libc::EIO));
        }
    }

    fn close(&self) {
        if let Some(qp) = self.qp.borrow_mut().take() {
            qp.close();
        }
        self.fail_waiting();
    }
}

/// Connects to the controller and identifies it (call on the first reactor).
pub async fn attach(opts: AttachOpts) -> Result<(Arc<HostCtrlr>, Vec<NsInfo>), String> {
    let addr = opts.socket_addr()?;
    let ctrlr = Arc::new(HostCtrlr {
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        addr,
        hostid: *uuid::Uuid::new_v4().as_bytes(),
        cntlid: AtomicU16::new(0),
        info: Mutex::new(CtrlrInfo::default()),
        detached: AtomicBool::new(false),
        resetting: AtomicBool::new(false),
        failed: AtomicBool::new(false),
        generation: AtomicU64::new(0),
        lost_at: AtomicU64::new(0),
        engine: ferrite_reactor::engine(),
        opts,
    });
    let ns = ctrlr.bring_up().await?;
    ctrlr.keep_alive();
    Ok((ctrlr, ns))
}

/// Stops everything of the controller: admin queue, I/O queues (on every reactor).
pub async fn detach(ctrlr: &Arc<HostCtrlr>) {
    ctrlr.detached.store(true, Ordering::Release);
    if let Some(a) = ADMIN.with(|a| a.borrow_mut().remove(&ctrlr.id)) {
        a.close();
    }
    let id = ctrlr.id;
    let _ = ctrlr
        .engine
        .on_all(move |_| {
            if let Some(p) = PATHS.with(|p| p.borrow_mut().remove(&id)) {
                p.close();
            }
        })
        .await;
}
