//! A controller: what a host's admin Connect creates and its I/O Connects attach to. Shared by
//! its queue pairs, which may live on different reactors; everything here is behind a mutex
//! or atomic and touched by admin commands, not by I/O.

use super::model::{SubsysShared, Trid};
use crate::spec::aer::AsyncEvent;
use crate::spec::log::ChangedNamespaceList;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Outstanding Asynchronous Event Requests a controller accepts (AERL + 1).
pub const AER_LIMIT: usize = 4;
/// Events kept for a host that has no AER outstanding.
const MAX_PENDING_EVENTS: usize = 64;

/// The controller's registers and features (admin state).
#[derive(Debug, Clone)]
pub struct CtrlrRegs {
    /// CC.
    pub cc: u32,
    /// CSTS.
    pub csts: u32,
    /// Features set by the host, by feature ID (value of CDW11).
    pub features: std::collections::BTreeMap<u8, u32>,
    /// Keep-alive timeout in milliseconds (0: none).
    pub kato_ms: u32,
    /// Async event configuration (which notices the host wants).
    pub aec: u32,
    /// Changed namespace list not yet read by the host.
    pub changed_ns: ChangedNamespaceList,
    /// Events raised but not yet delivered (no AER outstanding, or masked until the log is
    /// read).
    pub pending: VecDeque<AsyncEvent>,
    /// Events whose log page the host has not read yet (NVMe: the same event type is not
    /// reported again until it is).
    pub masked: Vec<u8>,
    /// Number of I/O queues granted (Set Features Number of Queues).
    pub io_queues: u16,
    /// Reservation Notification Mask (feature 82h) by NSID; namespaces not listed use
    /// `resv_mask_default` (what a Set with NSID FFFFFFFFh gave).
    pub resv_mask: std::collections::BTreeMap<u32, u32>,
    /// Reservation Notification Mask of namespaces not in `resv_mask`.
    pub resv_mask_default: u32,
}

/// Where an I/O queue pair lives: its reactor and its connection ID there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpairAt {
    /// The reactor that owns the connection.
    pub reactor: usize,
    /// The connection's ID in that reactor's table.
    pub conn: u64,
}

/// A controller.
pub struct Ctrlr {
    /// Controller ID.
    pub cntlid: u16,
    /// The subsystem's NQN.
    pub subnqn: String,
    /// The host's NQN.
    pub hostnqn: String,
    /// The host identifier from Connect.
    pub hostid: [u8; 16],
    /// The discovery controller.
    pub discovery: bool,
    /// The listener the admin queue connected through (its ANA states apply).
    pub listener: Trid,
    /// The subsystem's shared state.
    pub subsys: Arc<SubsysShared>,
    /// The reactor of the admin queue (asynchronous events are delivered there).
    pub admin_reactor: usize,
    /// The admin queue's connection ID (finds it in the reactor's table).
    pub admin_conn: u64,
    /// SQ flow control disabled by the host (C2HData SUCCESS may be used).
    pub sqflow_disabled: bool,
    /// Registers and features.
    pub regs: Mutex<CtrlrRegs>,
    /// Time of the last command on the admin queue or keep-alive (reactor ticks; ns in a
    /// simulation).
    pub last_keep_alive: AtomicU64,
    /// Gone (admin queue closed, keep-alive expired, subsystem deleted): its queue pairs close.
    pub dead: AtomicBool,
    /// I/O queue pairs connected.
    pub io_qpairs: AtomicU16,
    /// The connected I/O queue pairs by queue ID: where each lives (an Abort finds its
    /// command there).
    pub qids: Mutex<std::collections::BTreeMap<u16, QpairAt>>,
    /// Commands completed with an error (the error log page's count).
    pub errors: AtomicU64,
    /// Each queue pair's counters, for the SMART log (each written by its own reactor only).
    pub qstats: Mutex<Vec<Arc<CtrlrStats>>>,
    /// Generation of the subsystem's ANA/namespace state when the host last read the ANA log.
    pub ana_chgcnt: AtomicU64,
    /// The host as the reservation registry knows it (its Host Identifier from Connect).
    pub initiator: ferrite_bdev::Initiator,
    /// A hold on `initiator` interned: its number is what the I/O requests carry to the bdev
    /// layer (`initiator_ref.id()`), for as long as the controller lives.
    pub initiator_ref: ferrite_bdev::InitiatorRef,
    /// Reservation Notification log entries not yet read (log page 80h).
    pub resv_log: Mutex<super::resv::NoticeLog>,
}

/// Counters for the SMART / health log.
#[derive(Default)]
pub struct CtrlrStats {
    /// Read commands.
    pub reads: AtomicU64,
    /// Write commands.
    pub writes: AtomicU64,
    /// Bytes read.
    pub read_bytes: AtomicU64,
    /// Bytes written.
    pub written_bytes: AtomicU64,
}

impl Ctrlr {
    /// A new controller.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        cntlid: u16,
        subnqn: &str,
        hostnqn: &str,
        hostid: [u8; 16],
        discovery: bool,
        listener: Trid,
        subsys: Arc<SubsysShared>,
        admin_reactor: usize,
        admin_conn: u64,
        kato_ms: u32,
        sqflow_disabled: bool,
    ) -> Ctrlr {
        let initiator = ferrite_bdev::Initiator::Nvme { hostid, hostnqn: hostnqn.into() };
        Ctrlr {
            initiator_ref: initiator.intern(),
            initiator,
            cntlid,
            subnqn: subnqn.into(),
            hostnqn: hostnqn.into(),
            hostid,
            discovery,
            listener,
            subsys,
            admin_reactor,
            admin_conn,
            sqflow_disabled,
            regs: Mutex::new(CtrlrRegs {
                cc: 0,
                csts: 0,
                features: Default::default(),
                kato_ms,
                aec: 0,
                changed_ns: ChangedNamespaceList::default(),
                pending: VecDeque::new(),
                masked: Vec::new(),
                io_queues: 0,
                resv_mask: Default::default(),
                resv_mask_default: 0,
            }),
            last_keep_alive: AtomicU64::new(ferrite_reactor::tsc::ticks()),
            dead: AtomicBool::new(false),
            io_qpairs: AtomicU16::new(0),
            qids: Mutex::new(Default::default()),
            errors: AtomicU64::new(0),
            qstats: Mutex::new(Vec::new()),
            ana_chgcnt: AtomicU64::new(0),
            resv_log: Mutex::new(Default::default()),
        }
    }

    /// True once the controller is gone.
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Notes host activity (a keep-alive or any admin command).
    pub fn touch(&self) {
        self.last_keep_alive.store(ferrite_reactor::tsc::ticks(), Ordering::Relaxed);
    }

    /// True if the keep-alive timeout has passed without a keep-alive.
    pub fn keep_alive_expired(&self) -> bool {
        let kato = self.regs.lock().unwrap().kato_ms;
        if kato == 0 {
            return false;
        }
        let since = self.last_keep_alive.load(Ordering::Relaxed);
        let elapsed = ferrite_reactor::tsc::ticks().saturating_sub(since);
        // Hosts send keep-alives at half the timeout or so; a whole timeout without one is
        // expiry (SPDK checks the same way).
        elapsed > ferrite_reactor::tsc::duration_to_ticks(std::time::Duration::from_millis(u64::from(kato)))
    }

    /// Raises an asynchronous event (from any thread): queued, and the admin reactor is told
    /// to deliver it to an outstanding AER. Events the host masked (Set Features Async Event
    /// Configuration) or whose log page it has not yet read are dropped, as NVMe says.
    pub fn raise(self: &Arc<Self>, ev: AsyncEvent, enable_bit: u32) {
        {
            let mut r = self.regs.lock().unwrap();
            if enable_bit != 0 && r.aec & enable_bit == 0 {
                return;
            }
            if r.masked.contains(&ev.log_page) || r.pending.len() >= MAX_PENDING_EVENTS {
                return;
            }
            r.masked.push(ev.log_page);
            r.pending.push_back(ev);
        }
        let me = self.clone();
        if let Some(engine) = ferrite_reactor::current_engine() {
            engine.send(self.admin_reactor, move || super::qpair::deliver_events(&me));
        }
    }

    /// A new set of counters for one of its queue pairs.
    pub fn new_stats(&self) -> Arc<CtrlrStats> {
        let s = Arc::new(CtrlrStats::default());
        self.qstats.lock().unwrap().push(s.clone());
        s
    }

    /// The sum of its queue pairs' counters: (reads, writes, bytes read, bytes written).
    pub fn totals(&self) -> (u64, u64, u64, u64) {
        let q = self.qstats.lock().unwrap();
        let sum = |f: fn(&CtrlrStats) -> &AtomicU64| q.iter().map(|s| f(s).load(Ordering::Relaxed)).sum::<u64>();
        (sum(|s| &s.reads), sum(|s| &s.writes), sum(|s| &s.read_bytes), sum(|s| &s.written_bytes))
    }

    /// The host read log page `lid`: events of its type may be reported again.
    pub fn log_read(&self, lid: u8) {
        self.regs.lock().unwrap().masked.retain(|&l| l != lid);
    }
}
