//! A remote controller: its admin queue on the first reactor (initialization, identify,
//! keep-alive, asynchronous events, reconnection and failover between its paths), one I/O queue
//! pair per reactor ([`crate::path::IoPath`]) made when a channel there first submits.

use crate::ana::AnaTable;
use crate::options::TimeoutAction;
use crate::path::IoPath;
use crate::qpair::{ConnectParams, HostQpair, Reply};
use crate::trid::Trid;
use ferrite_nvme::spec::identify::{cns, NamespaceList, NsIdDescriptor};
use ferrite_nvme::spec::identify_ctrl::IdentifyController;
use ferrite_nvme::spec::identify_ns::IdentifyNamespace;
use ferrite_nvme::spec::opcode::admin as op;
use ferrite_nvme::spec::registers::{self, Cc, Csts};
use ferrite_nvme::spec::sqe::Sqe;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a second attach under the same name does (SPDK's `multipath` parameter).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A second attach under the name is refused.
    Disable,
    /// A second attach adds an alternate path to the controller, used when the active one is lost.
    Failover,
    /// A second attach makes another controller of the subsystem; namespaces they share are
    /// one bdev with a path through each (SPDK's default).
    Multipath,
}

impl Mode {
    /// Parses SPDK's names.
    pub fn parse(s: &str) -> Option<Mode> {
        match s {
            "disable" => Some(Mode::Disable),
            "failover" => Some(Mode::Failover),
            "multipath" => Some(Mode::Multipath),
            _ => None,
        }
    }

    /// SPDK's name.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Disable => "disable",
            Mode::Failover => "failover",
            Mode::Multipath => "multipath",
        }
    }
}

/// What `bdev_nvme_attach_controller` asked for.
#[derive(Debug, Clone)]
pub struct AttachOpts {
    /// Controller name (bdevs are `<name>n<nsid>`).
    pub name: String,
    /// The path given.
    pub trid: Trid,
    /// Host NQN.
    pub hostnqn: String,
    /// Header digests.
    pub hdgst: bool,
    /// Data digests.
    pub ddgst: bool,
    /// Ask every queue's controller to disable SQ flow control (`disable_sq_flow_control`).
    pub disable_sq_flow_control: bool,
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
    /// What a second attach under the name does.
    pub mode: Mode,
    /// An I/O command outstanding this long is acted on (`timeout_us`; zero: never).
    pub io_timeout: Duration,
    /// An admin command outstanding this long is acted on (zero: never).
    pub admin_timeout: Duration,
    /// What is done then (`action_on_timeout`).
    pub on_timeout: crate::options::TimeoutAction,
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
    /// EUI-64.
    pub eui64: [u8; 8],
    /// UUID from the namespace identification descriptors.
    pub uuid: Option<[u8; 16]>,
    /// The namespace is write-protected (NSATTR bit 0: an lvol snapshot on a Ferrite target).
    pub write_protected: bool,
    /// Preferred deallocate granularity and alignment in blocks (NPDG and NPDA, 1-based;
    /// 0 where NSFEAT does not define them).
    pub dealloc_granularity: u32,
    /// See `dealloc_granularity`.
    pub dealloc_alignment: u32,
}

impl NsInfo {
    /// True if both identify the same namespace (SPDK's `bdev_nvme_compare_ns`: NGUID, EUI-64
    /// and UUID all equal).
    pub fn same_namespace(&self, o: &NsInfo) -> bool {
        self.nguid == o.nguid && self.eui64 == o.eui64 && self.uuid == o.uuid
    }
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
    /// Multi-path I/O and namespace sharing capabilities (CMIC).
    pub cmic: u8,
    /// Entries of an I/O queue: `io_queue_size`, capped by the controller's largest (CAP.MQES + 1).
    pub io_entries: u16,
    /// I/O queues the controller granted (Number of Queues; at most one per reactor asked;
    /// 0 until known).
    pub io_queues: u16,
}

/// A remote controller.
pub struct HostCtrlr {
    /// Unique ID in the process.
    pub id: u64,
    /// Options of the attach that made it.
    pub opts: AttachOpts,
    /// Its paths: the first is the active one, the others alternates (failover), in the
    /// order they are tried.
    pub trids: Mutex<Vec<Trid>>,
    hostid: [u8; 16],
    /// Current controller ID.
    pub cntlid: AtomicU16,
    /// Identify results.
    pub info: Mutex<CtrlrInfo>,
    /// Its namespaces as last identified.
    pub namespaces: Mutex<Vec<NsInfo>>,
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
    /// A reset disconnected it on purpose: not a loss (I/O waits without the loss timeouts)
    /// unless the first reconnection fails.
    reset_requested: AtomicBool,
    /// An I/O queue pair failed and the controller is being recovered (SPDK's reset after a
    /// disconnected qpair): the trouble's start (`lost_at`) is kept through the admin queue's
    /// reconnection until an I/O queue pair has stayed up for a reconnect delay.
    io_recovery: AtomicBool,
    /// The next reconnection of the admin queue waits a reconnect delay first (the last
    /// recovery did not bring the I/O queues back: SPDK's delayed reconnect).
    delay_reconnect: AtomicBool,
    /// ANA state per namespace.
    pub ana: AnaTable,
    /// An ANA log read is under way.
    pub ana_updating: AtomicBool,
    /// The generation of the paths of its name: bumped whenever something that chooses a
    /// path changes (state, ANA, paths added or removed); channels choose again when it moves.
    pub paths_gen: Arc<AtomicU64>,
    /// Engine the controller lives in.
    pub(crate) engine: ferrite_reactor::Engine,
    /// Its outstanding Aborts, against its Abort Command Limit.
    pub(crate) aborts: Arc<crate::abort::AbortGate>,
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// How long a controller's initialization (enable, identify, features, ANA log) may take, as
/// SPDK's default admin timeout: a controller that accepts a Connect and then answers nothing
/// fails the attach or the reconnection attempt instead of holding it.
const INIT_LIMIT: Duration = Duration::from_secs(30);

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

/// Entries of an I/O queue: `wanted`, at most the controller's largest (CAP.MQES, 0-based, bits
/// 15:0) and at least 2 (the smallest queue there is), as SPDK's host caps `io_queue_size`.
fn io_queue_entries(wanted: u16, cap: u64) -> u16 {
    let largest = (cap & 0xffff) as u32 + 1;
    (u32::from(wanted).min(largest).max(2)) as u16
}

/// I/O queues a Number of Queues answer grants: the fewer of its submission (bits 15:0) and
/// completion (bits 31:16) queues, both 0-based.
fn granted_io_queues(dw0: u32) -> u16 {
    ((dw0 & 0xffff).min(dw0 >> 16) + 1).min(u32::from(u16::MAX)) as u16
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(ferrite_nvme::spec::identify_ctrl::field_text(b)).trim().to_string()
}

impl HostCtrlr {
    /// The active path.
    pub fn active_trid(&self) -> Trid {
        self.trids.lock().unwrap()[0].clone()
    }

    pub(crate) fn params(&self, qid: u16, entries: u16, cntlid: u16) -> Result<ConnectParams, String> {
        let trid = self.active_trid();
        Ok(ConnectParams {
            addr: trid.socket_addr()?,
            subnqn: trid.subnqn,
            hostnqn: self.opts.hostnqn.clone(),
            hostid: self.hostid,
            qid,
            entries,
            cntlid,
            kato_ms: if qid == 0 { self.opts.kato_ms } else { 0 },
            hdgst: self.opts.hdgst,
            ddgst: self.opts.ddgst,
            disable_sqflow: self.opts.disable_sq_flow_control,
            timeout: Duration::from_secs(10),
        })
    }

    /// Entries of its I/O queues (`io_queue_size` until the controller's CAP was read).
    pub(crate) fn io_entries(&self) -> u16 {
        match self.info.lock().unwrap().io_entries {
            0 => self.opts.io_queue_size,
            n => n,
        }
    }

    /// Tells the channels of its name to choose their paths again.
    pub fn paths_changed(&self) {
        self.paths_gen.fetch_add(1, Ordering::AcqRel);
    }

    /// True while I/O may be sent to it without waiting (connected, not failed or detached).
    pub fn is_up(&self) -> bool {
        !self.detached.load(Ordering::Acquire)
            && !self.failed.load(Ordering::Acquire)
            && !self.resetting.load(Ordering::Acquire)
    }

    /// Connects (or reconnects) the admin queue on the active path and brings the controller
    /// up: CC.EN, CSTS.RDY, identify, number of queues, ANA states, asynchronous events.
    /// Returns the namespaces. Runs on the first reactor.
    async fn bring_up(self: &Arc<Self>) -> Result<Vec<NsInfo>, String> {
        let admin = HostQpair::connect(&self.params(0, 32, 0xffff)?).await?;
        self.watch(&admin);
        let cntlid = admin.cntlid.get();
        let result = match crate::qpair::with_deadline(self.init_admin(&admin), Instant::now() + INIT_LIMIT).await {
            Some(r) => r,
            None => Err(format!("the controller did not finish its initialization in {} s", INIT_LIMIT.as_secs())),
        };
        match result {
            Ok(ns) => {
                self.cntlid.store(cntlid, Ordering::Release);
                *self.namespaces.lock().unwrap() = ns.clone();
                ADMIN.with(|a| a.borrow_mut().insert(self.id, admin.clone()));
                let me = self.clone();
                let gen = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
                admin.on_close(move || me.admin_lost(gen));
                crate::ana::start_aer(self, &admin);
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
        let io_entries = io_queue_entries(self.opts.io_queue_size, cap);
        if io_entries < self.opts.io_queue_size {
            log::info!(
                "nvme controller {}: I/O queues of {io_entries} entries, the controller's largest (io_queue_size {})",
                self.opts.name,
                self.opts.io_queue_size
            );
        }
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
            cmic: ctrl.cmic,
            io_entries,
            io_queues: 0,
        };
        self.aborts.set_acl(ctrl.acl);
        // Number of queues: one I/O queue per reactor.
        let n = self.engine.count() as u32;
        let mut sqe = Sqe::new(op::SET_FEATURES, 0, 0);
        sqe.cdw10 = u32::from(ferrite_nvme::spec::features::fid::NUMBER_OF_QUEUES);
        sqe.cdw11 = (n - 1) | (n - 1) << 16;
        let r = admin.submit_wait(sqe, None, 0).await?;
        check(&r, "Set Features Number of Queues")?;
        let io_queues = granted_io_queues(r.cqe.dw0);
        if u32::from(io_queues) < n {
            log::warn!(
                "nvme controller {}: the controller grants {io_queues} I/O queues for {n} reactors: I/O on the others fails",
                self.opts.name
            );
        }
        self.info.lock().unwrap().io_queues = io_queues;
        // Namespace attribute and ANA change notices (a controller without them refuses; no
        // matter).
        let mut sqe = Sqe::new(op::SET_FEATURES, 0, 0);
        sqe.cdw10 = u32::from(ferrite_nvme::spec::features::fid::ASYNC_EVENT_CONFIGURATION);
        sqe.cdw11 = 1 << 8 | 1 << 11;
        let _ = admin.submit_wait(sqe, None, 0).await;
        let out = scan_namespaces(admin).await?;
        if ctrl.cmic & ferrite_nvme::spec::identify_ctrl::cmic::ANA_REPORTING != 0 {
            match crate::ana::read_log(admin).await {
                Ok(map) => {
                    if self.ana.replace(map) {
                        self.paths_changed();
                    }
                }
                Err(e) => log::info!("nvme controller {}: ANA log: {e}", self.opts.name),
            }
        }
        Ok(out)
    }

    /// The admin queue of generation `gen` closed: unless detached, reconnect it, first at
    /// once on each alternate path in turn (failover), then every `reconnect_delay_sec` until
    /// `ctrlr_loss_timeout_sec`; keep-alive resumes.
    fn admin_lost(self: &Arc<Self>, gen: u64) {
        if self.detached.load(Ordering::Acquire) || self.generation.load(Ordering::Acquire) != gen {
            return;
        }
        ADMIN.with(|a| a.borrow_mut().remove(&self.id));
        self.resetting.store(true, Ordering::Release);
        self.paths_changed();
        if self.reset_requested.load(Ordering::Acquire) {
            log::warn!("nvme controller {}: reset: connecting a new controller", self.opts.name);
        } else if self.io_recovery.load(Ordering::Acquire) {
            log::warn!("nvme controller {}: resetting the controller for its failed I/O queue", self.opts.name);
        } else {
            let _ = self.lost_at.compare_exchange(0, now_ns(), Ordering::AcqRel, Ordering::Acquire);
            log::warn!("nvme controller {}: admin queue lost; reconnecting", self.opts.name);
        }
        // As SPDK's and Linux's hosts do, the I/O queue pairs go with the admin queue: their
        // commands and the I/O waiting for this controller go back to their channels, which
        // send them again once it is back, or to another controller of the subsystem
        // (multipath). A controller that answers nothing holds no I/O while it is away.
        let id = self.id;
        self.engine.on_all(move |_| {
            if let Some(p) = PATHS.with(|p| p.borrow().get(&id).cloned()) {
                p.close();
            }
        });
        let me = self.clone();
        // After a recovery that did not bring the I/O queues back, the next attempt waits the
        // delay (and the loss timeout is checked first), as every attempt after the first round.
        let delayed = self.delay_reconnect.swap(false, Ordering::AcqRel);
        ferrite_reactor::spawn_local(async move {
            let mut attempt = if delayed { usize::MAX / 2 } else { 0 };
            loop {
                if me.detached.load(Ordering::Acquire) {
                    return;
                }
                let n = me.trids.lock().unwrap().len();
                if attempt > 0 && me.reset_requested.swap(false, Ordering::AcqRel) {
                    // The reset's reconnection failed: from now on this is a loss.
                    let _ = me.lost_at.compare_exchange(0, now_ns(), Ordering::AcqRel, Ordering::Acquire);
                }
                // Each path is tried once at once; after that, the loss timeout and the delay.
                if attempt >= n {
                    // A loss timeout of 0: no reconnection after this first round.
                    if me.opts.ctrlr_loss_timeout_sec == 0 || me.loss_timed_out() {
                        log::warn!("nvme controller {}: ctrlr_loss_timeout_sec passed; giving up", me.opts.name);
                        me.failed.store(true, Ordering::Release);
                        me.paths_changed();
                        me.fail_paths();
                        crate::group::remove_lost(&me).await;
                        return;
                    }
                    ferrite_reactor::sleep(Duration::from_secs(me.opts.reconnect_delay_sec.max(1))).await;
                }
                attempt += 1;
                if n > 1 {
                    // Failover: the lost path goes to the end of the list.
                    let mut t = me.trids.lock().unwrap();
                    t.rotate_left(1);
                    log::info!("nvme controller {}: trying path {}:{}", me.opts.name, t[0].traddr, t[0].trsvcid);
                }
                match me.bring_up().await {
                    Ok(ns) => {
                        // Namespaces may have come or gone while it was away.
                        crate::group::namespaces_changed(&me, &ns);
                        me.reset_requested.store(false, Ordering::Release);
                        if !me.io_recovery.load(Ordering::Acquire) {
                            // Recovering from failed I/O queues: the trouble lasts until one
                            // stays up (`io_queue_connected`).
                            me.lost_at.store(0, Ordering::Release);
                        }
                        me.resetting.store(false, Ordering::Release);
                        me.paths_changed();
                        let t = me.active_trid();
                        log::info!(
                            "nvme controller {}: reconnected to {}:{} (cntlid {})",
                            me.opts.name,
                            t.traddr,
                            t.trsvcid,
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

    /// An I/O queue pair of generation `gen` failed on its own, or could not be connected (on
    /// its reactor). As SPDK's bdev_nvme does for a disconnected qpair, the controller is
    /// reset (on the next path first, failover), its trouble counted from the first failure
    /// (`fast_io_fail_timeout_sec` and `ctrlr_loss_timeout_sec` run from then): at once the
    /// first time, after a reconnect delay while the resets do not bring the I/O queues back,
    /// until the loss timeout; with `ctrlr_loss_timeout_sec` 0 only once. True if a reset
    /// comes (the path waits for it), false if not (the path fails what waits).
    pub(crate) fn io_queue_failed(self: &Arc<Self>, gen: u64) -> bool {
        if self.detached.load(Ordering::Acquire) || self.failed.load(Ordering::Acquire) {
            return false;
        }
        let first = self.lost_at.compare_exchange(0, now_ns(), Ordering::AcqRel, Ordering::Acquire).is_ok();
        if !first && self.opts.ctrlr_loss_timeout_sec == 0 {
            return false;
        }
        self.io_recovery.store(true, Ordering::Release);
        let me = self.clone();
        self.engine.send(0, move || me.recover(gen, !first));
        true
    }

    /// Resets the controller of generation `gen` for its failed I/O queue (first reactor),
    /// unless it moved on or a reset or reconnection is under way (which the path waits for).
    fn recover(self: &Arc<Self>, gen: u64, delayed: bool) {
        if self.detached.load(Ordering::Acquire)
            || self.generation.load(Ordering::Acquire) != gen
            || self.resetting.load(Ordering::Acquire)
        {
            return;
        }
        let Some(admin) = ADMIN.with(|a| a.borrow().get(&self.id).cloned()) else { return };
        self.delay_reconnect.store(delayed, Ordering::Release);
        admin.close();
    }

    /// An I/O queue pair of generation `gen` connected: once a command on it completes
    /// successfully, or if it stays up for a reconnect delay, while the controller keeps its
    /// generation, a recovery from failed I/O queues is over (the trouble's clock stops). SPDK's
    /// clock stops at every reset that brings the queue pairs back; the proof asked here keeps a
    /// controller whose I/O queues fail right after their Connect from resetting for ever, and
    /// a path that drops now and then but serves in between is never given up.
    pub(crate) fn io_queue_connected(self: &Arc<Self>, qp: &Rc<HostQpair>, gen: u64) {
        if !self.io_recovery.load(Ordering::Acquire) {
            return;
        }
        let me = self.clone();
        qp.on_success(move || me.io_queue_proved(gen));
        let (me, qp) = (self.clone(), Rc::downgrade(qp));
        ferrite_reactor::after(Duration::from_secs(self.opts.reconnect_delay_sec.max(1)), move || {
            if qp.upgrade().is_some_and(|q| !q.is_closed()) {
                me.io_queue_proved(gen);
            }
        });
    }

    /// An I/O queue pair of generation `gen` works again: the recovery is over if the
    /// controller is still that generation and not resetting.
    fn io_queue_proved(&self, gen: u64) {
        if self.generation.load(Ordering::Acquire) == gen && !self.resetting.load(Ordering::Acquire) {
            if self.io_recovery.swap(false, Ordering::AcqRel) {
                log::info!("nvme controller {}: I/O queues are back", self.opts.name);
            }
            self.lost_at.store(0, Ordering::Release);
        }
    }

    /// Resets the controller (SPDK's `bdev_nvme_reset_controller`): its admin queue is
    /// disconnected and a new controller is connected on the same path; each reactor's I/O
    /// queue pair of the old one is then dropped (its commands go back to their channels and are
    /// sent again) and a new one made when needed. Waits until the controller is up again, or
    /// until the reconnection gives up (`ctrlr_loss_timeout_sec`). Runs on the first reactor.
    /// Errors are errnos: ENODEV once detached, EBUSY while a reset or reconnection is under
    /// way, EIO if the controller could not be reconnected.
    pub async fn reset(self: &Arc<Self>) -> Result<(), i32> {
        if self.detached.load(Ordering::Acquire) {
            return Err(libc::ENODEV);
        }
        if !self.is_up() || self.failed.load(Ordering::Acquire) {
            return Err(libc::EBUSY);
        }
        let Some(admin) = ADMIN.with(|a| a.borrow().get(&self.id).cloned()) else {
            return Err(libc::EBUSY);
        };
        let gen = self.generation.load(Ordering::Acquire);
        {
            // The admin queue's loss tries the next path first (rotating the list left): a
            // reset stays on the active one.
            let mut t = self.trids.lock().unwrap();
            if t.len() > 1 {
                t.rotate_right(1);
            }
        }
        self.reset_requested.store(true, Ordering::Release);
        admin.close();
        // The reconnection (`admin_lost`) runs on its own; wait for its outcome.
        self.wait_up(Some(gen)).await
    }

    /// Waits until the controller is up (in a generation after `gen`, if given): Ok, or
    /// ENODEV once detached, EIO once given up on.
    async fn wait_up(&self, gen: Option<u64>) -> Result<(), i32> {
        loop {
            if self.detached.load(Ordering::Acquire) {
                return Err(libc::ENODEV);
            }
            if self.failed.load(Ordering::Acquire) {
                return Err(libc::EIO);
            }
            if gen.is_none_or(|g| self.generation.load(Ordering::Acquire) != g) && self.is_up() {
                return Ok(());
            }
            ferrite_reactor::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Resets the controller, or, if a reset or reconnection is already under way, waits for
    /// its outcome (the bdev layer's reset of a namespace: SPDK's reset I/O). Runs on the first
    /// reactor.
    pub async fn reset_or_join(self: &Arc<Self>) -> Result<(), i32> {
        match self.reset().await {
            Err(libc::EBUSY) => self.wait_up(None).await,
            r => r,
        }
    }

    /// Reads the namespaces again (a namespace attribute notice, or a reconnection) and has the
    /// group add, remove or resize its bdevs to match. Runs on the first reactor.
    pub async fn rescan(self: &Arc<Self>, admin: &HostQpair) {
        match scan_namespaces(admin).await {
            Ok(ns) => {
                *self.namespaces.lock().unwrap() = ns.clone();
                crate::group::namespaces_changed(self, &ns);
            }
            Err(e) => log::warn!("nvme controller {}: namespace rescan: {e}", self.opts.name),
        }
    }

    /// True once the loss timeout has passed since the controller was lost. A timeout of 0
    /// (never reconnect) is not a time: such a controller is still tried once on each path
    /// at its loss, as SPDK's reset does, and its I/O waits for that; if none comes back it
    /// is `failed`.
    pub fn loss_timed_out(&self) -> bool {
        let t = self.opts.ctrlr_loss_timeout_sec;
        let lost = self.lost_at.load(Ordering::Acquire);
        if lost == 0 || t <= 0 {
            return false;
        }
        now_ns().saturating_sub(lost) >= (t as u64).saturating_mul(1_000_000_000)
    }

    /// True once waiting I/O should fail (fast_io_fail_timeout or the loss timeout).
    pub(crate) fn io_fail_due(&self) -> bool {
        if self.failed.load(Ordering::Acquire) {
            return true;
        }
        let lost = self.lost_at.load(Ordering::Acquire);
        if lost == 0 {
            return false;
        }
        let f = self.opts.fast_io_fail_timeout_sec;
        (f > 0 && now_ns().saturating_sub(lost) >= f.saturating_mul(1_000_000_000)) || self.loss_timed_out()
    }

    fn fail_paths(&self) {
        let id = self.id;
        self.engine.on_all(move |_| {
            if let Some(p) = PATHS.with(|p| p.borrow().get(&id).cloned()) {
                p.fail_waiting();
            }
        });
    }

    /// Starts the keep-alive task (first reactor): a Keep Alive every half keep-alive timeout.
    /// One the controller does not answer within the timeout (when the controller would have
    /// given up on the host, too) counts as the controller's loss, as on Linux's host: the
    /// admin queue is closed and reconnected.
    fn keep_alive(self: &Arc<Self>) {
        if self.opts.kato_ms == 0 {
            return;
        }
        let me = self.clone();
        let period = Duration::from_millis(u64::from(self.opts.kato_ms / 2).max(500));
        let limit = Duration::from_millis(u64::from(self.opts.kato_ms).max(1000));
        ferrite_reactor::spawn_local(async move {
            loop {
                if !crate::qpair::sleep_while(period, || !me.detached.load(Ordering::Acquire)).await {
                    return;
                }
                let Some(admin) = ADMIN.with(|a| a.borrow().get(&me.id).cloned()) else { continue };
                let sqe = Sqe::new(op::KEEP_ALIVE, 0, 0);
                match crate::qpair::with_deadline(admin.submit_wait(sqe, None, 0), Instant::now() + limit).await {
                    Some(Ok(_)) => {}
                    Some(Err(e)) => log::info!("nvme controller {}: keep-alive: {e}", me.opts.name),
                    None => {
                        log::warn!(
                            "nvme controller {}: keep-alive unanswered for {} ms; the controller is lost",
                            me.opts.name,
                            limit.as_millis()
                        );
                        admin.close();
                    }
                }
            }
        })
        .detach();
    }

    /// Starts the watchdog of queue pair `qp` if its commands are timed (`timeout_us`,
    /// `timeout_admin_us`).
    pub(crate) fn watch(self: &Arc<Self>, qp: &Rc<HostQpair>) {
        let limit = if qp.qid() == 0 { self.opts.admin_timeout } else { self.opts.io_timeout };
        if limit.is_zero() {
            return;
        }
        let me = Arc::downgrade(self);
        qp.watch(
            limit,
            Box::new(move |qp, cid| {
                if let Some(c) = me.upgrade() {
                    c.timed_out(qp, cid);
                }
            }),
        );
    }

    /// Command `cid` of `qp` is past its timeout: what SPDK's `timeout_cb` does. On the
    /// queue pair's reactor.
    fn timed_out(self: &Arc<Self>, qp: &Rc<HostQpair>, cid: u16) {
        let name = &self.opts.name;
        let sqid = qp.qid();
        log::warn!("nvme controller {name}: command {cid} of queue {sqid} timed out");
        if self.detached.load(Ordering::Acquire) {
            return;
        }
        match self.opts.on_timeout {
            TimeoutAction::None => {}
            TimeoutAction::Abort if sqid != 0 => {
                if !self.is_up() {
                    log::info!("nvme controller {name}: not available; command {cid} is not aborted");
                    return;
                }
                let (me, qp) = (self.clone(), qp.clone());
                ferrite_reactor::spawn_local(async move {
                    // Sent only if the command is still the one that timed out: while the
                    // Abort waited for the controller's limit, its ID may have been reused.
                    use crate::abort::Outcome;
                    match crate::abort::send_abort(&me, &qp, cid, |qp| qp.is_timed_out(cid)).await {
                        Outcome::Gone | Outcome::Aborted | Outcome::Closed => {}
                        Outcome::NotAborted | Outcome::Failed => {
                            log::warn!(
                                "nvme controller {}: command {cid} of queue {sqid} not aborted; resetting",
                                me.opts.name
                            );
                            me.reset_soon();
                        }
                    }
                })
                .detach();
            }
            _ => {
                // An admin command of a queue still being brought up (not yet the controller's
                // admin queue): the bring-up fails, and the reconnection goes on.
                let current = sqid != 0 || ADMIN.with(|a| a.borrow().get(&self.id).is_some_and(|a| Rc::ptr_eq(a, qp)));
                if current {
                    self.reset_soon();
                } else {
                    qp.close();
                }
            }
        }
    }

    /// Resets the controller, from any reactor, unless a reset or reconnection is under way.
    fn reset_soon(self: &Arc<Self>) {
        let me = self.clone();
        self.engine.send(0, move || {
            ferrite_reactor::spawn_local(async move {
                match me.reset().await {
                    Ok(()) | Err(libc::EBUSY) | Err(libc::ENODEV) => {}
                    Err(e) => log::warn!(
                        "nvme controller {}: reset after a timeout: {}",
                        me.opts.name,
                        std::io::Error::from_raw_os_error(e)
                    ),
                }
            })
            .detach();
        });
    }

    /// This reactor's I/O path to the controller.
    pub(crate) fn path(self: &Arc<Self>) -> Rc<IoPath> {
        PATHS.with(|p| p.borrow_mut().entry(self.id).or_insert_with(|| IoPath::new(self.clone())).clone())
    }

    /// Sends an admin command on the first reactor from any reactor; the answer comes back
    /// to the caller's.
    pub(crate) async fn admin_command(self: &Arc<Self>, sqe: Sqe) -> Result<Reply, String> {
        let id = self.id;
        let rx = self.engine.run_async(0, move || async move {
            let Some(admin) = ADMIN.with(|a| a.borrow().get(&id).cloned()) else {
                return Err("the admin queue is not connected".to_string());
            };
            admin.submit_wait(sqe, None, 0).await
        });
        rx.await.map_err(|_| "the first reactor stopped".to_string())?
    }

    /// Re-reads the ANA log (an I/O failed with an ANA status), unless a read is under way.
    pub(crate) fn refresh_ana(self: &Arc<Self>) {
        if self.ana_updating.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = self.clone();
        self.engine.send(0, move || {
            let Some(admin) = ADMIN.with(|a| a.borrow().get(&me.id).cloned()) else {
                me.ana_updating.store(false, Ordering::Release);
                return;
            };
            ferrite_reactor::spawn_local(async move { crate::ana::update(&me, &admin).await }).detach();
        });
    }

    /// Drops the path `t` (not the active one: use [`HostCtrlr::fail_over`] for that).
    pub fn remove_alternate(&self, t: &Trid) -> bool {
        let mut l = self.trids.lock().unwrap();
        let before = l.len();
        let mut first = true;
        l.retain(|x| std::mem::replace(&mut first, false) || x != t);
        l.len() != before
    }

    /// Removes the active path and switches to the next one at once (SPDK's detach of the
    /// active path while alternates remain). On the first reactor.
    pub fn fail_over(self: &Arc<Self>) {
        {
            let mut l = self.trids.lock().unwrap();
            if l.len() < 2 {
                return;
            }
            // The admin queue's loss rotates the list left before it connects: with the
            // removed path gone and the last alternate put first, the rotation tries the
            // next alternate first, as SPDK's failover does.
            l.remove(0);
            let last = l.pop().expect("an alternate");
            l.insert(0, last);
        }
        if let Some(a) = ADMIN.with(|a| a.borrow().get(&self.id).cloned()) {
            a.close();
        }
    }
}

fn kick_path(id: u64) {
    if let Some(p) = PATHS.with(|p| p.borrow().get(&id).cloned()) {
        p.kick();
    }
}

/// A failed completion as an error.
pub(crate) fn check(r: &Reply, what: &str) -> Result<(), String> {
    if let Some(why) = &r.closed {
        // The connection ended under the command: say why, not the made-up path error.
        Err(format!("{what}: {why}"))
    } else if r.cqe.status.is_success() {
        Ok(())
    } else {
        Err(format!("{what}: status sct {:#x} sc {:#x}", r.cqe.status.sct, r.cqe.status.sc))
    }
}

/// The controller's active namespaces (Identify active namespace list, then each namespace
/// and its identification descriptors); namespaces without a usable format or of size 0 are
/// left out.
async fn scan_namespaces(admin: &HostQpair) -> Result<Vec<NsInfo>, String> {
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
        let uuid = match identify(admin, cns::NS_ID_DESCRIPTOR_LIST, nsid).await {
            Ok(d) => NsIdDescriptor::read_list(&d).find_map(|x| match x {
                NsIdDescriptor::Uuid(u) => Some(u),
                _ => None,
            }),
            Err(_) => None,
        };
        let write_protected = ns.nsattr & ferrite_nvme::spec::identify_ns::nsattr::WRITE_PROTECTED != 0;
        let optperf = ns.nsfeat & ferrite_nvme::spec::identify_ns::nsfeat::OPTPERF != 0;
        let (dealloc_granularity, dealloc_alignment) =
            if optperf { (u32::from(ns.npdg) + 1, u32::from(ns.npda) + 1) } else { (0, 0) };
        out.push(NsInfo {
            nsid,
            block_size: bs,
            num_blocks: ns.nsze,
            nguid: ns.nguid,
            eui64: ns.eui64,
            uuid,
            write_protected,
            dealloc_granularity,
            dealloc_alignment,
        });
    }
    Ok(out)
}

async fn prop_get(admin: &HostQpair, ofst: u32, size: u8) -> Result<u64, String> {
    let c = ferrite_nvme::spec::fabrics::PropertyGetCommand {
        cid: 0,
        size: if size == 8 {
            ferrite_nvme::spec::fabrics::PROPERTY_SIZE_8
        } else {
            ferrite_nvme::spec::fabrics::PROPERTY_SIZE_4
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
    let c = ferrite_nvme::spec::fabrics::PropertySetCommand {
        cid: 0,
        size: ferrite_nvme::spec::fabrics::PROPERTY_SIZE_4,
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

/// Connects to the controller on `opts.trid` and identifies it (call on the first reactor).
/// `paths_gen` is the generation of the paths of its name.
pub async fn attach(opts: AttachOpts, paths_gen: Arc<AtomicU64>) -> Result<(Arc<HostCtrlr>, Vec<NsInfo>), String> {
    opts.trid.socket_addr()?;
    let ctrlr = Arc::new(HostCtrlr {
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        trids: Mutex::new(vec![opts.trid.clone()]),
        hostid: *uuid::Uuid::new_v4().as_bytes(),
        cntlid: AtomicU16::new(0),
        info: Mutex::new(CtrlrInfo::default()),
        aborts: crate::abort::AbortGate::new(),
        namespaces: Mutex::new(Vec::new()),
        detached: AtomicBool::new(false),
        resetting: AtomicBool::new(false),
        reset_requested: AtomicBool::new(false),
        io_recovery: AtomicBool::new(false),
        delay_reconnect: AtomicBool::new(false),
        failed: AtomicBool::new(false),
        generation: AtomicU64::new(0),
        lost_at: AtomicU64::new(0),
        ana: AnaTable::default(),
        ana_updating: AtomicBool::new(false),
        paths_gen,
        engine: ferrite_reactor::engine(),
        opts,
    });
    match ctrlr.bring_up().await {
        Ok(ns) => {
            ctrlr.keep_alive();
            Ok((ctrlr, ns))
        }
        Err(e) => {
            ctrlr.detached.store(true, Ordering::Release);
            Err(e)
        }
    }
}

/// Connects to `trid` as `ctrlr`'s host would, identifies the controller and its namespaces,
/// and disconnects: what a path must show before it is added as an alternate (SPDK probes it
/// the same way).
pub async fn probe(ctrlr: &Arc<HostCtrlr>, trid: &Trid) -> Result<(CtrlrInfo, Vec<NsInfo>), String> {
    let mut opts = ctrlr.opts.clone();
    opts.trid = trid.clone();
    let (c, ns) = attach(opts, Arc::new(AtomicU64::new(0))).await?;
    let info = c.info.lock().unwrap().clone();
    detach(&c).await;
    Ok((info, ns))
}

/// Stops everything of the controller: admin queue, I/O queues (on every reactor).
pub async fn detach(ctrlr: &Arc<HostCtrlr>) {
    ctrlr.detached.store(true, Ordering::Release);
    ctrlr.paths_changed();
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

#[cfg(test)]
mod tests {
    use super::{granted_io_queues, io_queue_entries};

    #[test]
    fn granted_io_queues_are_the_fewer_of_both_kinds() {
        assert_eq!(granted_io_queues(0), 1);
        assert_eq!(granted_io_queues(0x0003_0001), 2);
        assert_eq!(granted_io_queues(0x0001_0003), 2);
        assert_eq!(granted_io_queues(0xfffe_fffe), 0xffff);
        assert_eq!(granted_io_queues(0xffff_ffff), 0xffff);
    }

    #[test]
    fn io_queues_are_capped_by_the_controllers_largest() {
        // CAP.MQES is 0-based: 31 means 32 entries.
        assert_eq!(io_queue_entries(128, 31), 32);
        assert_eq!(io_queue_entries(128, 127), 128);
        assert_eq!(io_queue_entries(64, 0xffff), 64);
        // Other CAP fields (TO, CQR, DSTRD...) do not count.
        assert_eq!(io_queue_entries(128, 0x0000_0020_ff01_003f), 64);
        // MQES 0 is not valid; a queue has at least 2 entries.
        assert_eq!(io_queue_entries(128, 0), 2);
    }
}
