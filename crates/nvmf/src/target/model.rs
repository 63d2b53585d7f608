//! The target's configuration: the TCP transport's options, subsystems with their namespaces,
//! hosts and listeners, discovery referrals, and the live controllers. One set per engine
//! (`ferrite_reactor::lock_state`), changed by RPCs and read by connections when a host
//! connects, identifies or asks for a log page (never on the I/O path: a queue pair caches
//! what it needs and watches [`SubsysShared::ns_epoch`]).

use super::ctrlr::Ctrlr;
use crate::spec::nqn;
use ferrite_bdev::{Bdev, BdevDesc};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Default in-capsule data size of an I/O queue (SPDK's default).
pub const DEFAULT_IN_CAPSULE_DATA: u32 = 4096;
/// Default largest I/O (SPDK's `max_io_size`).
pub const DEFAULT_MAX_IO_SIZE: u32 = 131_072;
/// Default MAXH2CDATA announced in ICResp (SPDK's).
pub const DEFAULT_MAXH2CDATA: u32 = 131_072;
/// Default entries of an I/O queue (SPDK's `max_queue_depth`).
pub const DEFAULT_MAX_QUEUE_DEPTH: u16 = 128;
/// Default entries of the admin queue (SPDK's `max_aq_depth`).
pub const DEFAULT_MAX_AQ_DEPTH: u16 = 128;
/// Default I/O queues per controller plus the admin queue (SPDK's `max_qpairs_per_ctrlr`).
pub const DEFAULT_MAX_QPAIRS_PER_CTRLR: u16 = 128;
/// Default limit of subsystems (SPDK's `max_subsystems`).
pub const DEFAULT_MAX_SUBSYSTEMS: u32 = 1024;
/// Namespaces a subsystem has room for when `max_namespaces` is not given (SPDK's default 0
/// means "up to 32, grown on demand"; Ferrite grows to this bound).
pub const DEFAULT_MAX_NAMESPACES: u32 = 1024;
/// Highest controller ID (NVMe: FFEFh).
pub const MAX_CNTLID: u16 = 0xffef;

/// The TCP transport's options (`nvmf_create_transport`), SPDK's names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportOpts {
    /// Entries of an I/O queue (MQES + 1).
    pub max_queue_depth: u16,
    /// Entries of the admin queue.
    pub max_aq_depth: u16,
    /// Queue pairs per controller, the admin queue included.
    pub max_qpairs_per_ctrlr: u16,
    /// In-capsule data an I/O command may carry.
    pub in_capsule_data_size: u32,
    /// Largest I/O in bytes (MDTS).
    pub max_io_size: u32,
    /// Unit of data buffers (kept for SPDK's configs; Ferrite's buffers come from the pool).
    pub io_unit_size: u32,
    /// MAXH2CDATA announced.
    pub max_h2c_data: u32,
    /// Set the C2HData SUCCESS flag (and skip the response) when the host allows it.
    pub c2h_success: bool,
    /// Type of service of the sockets (kept for SPDK's configs).
    pub sock_priority: u32,
    /// Abort timeout in seconds (kept for SPDK's configs).
    pub abort_timeout_sec: u32,
    /// The rest of SPDK's options, kept as given so that save_config writes them back.
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl TransportOpts {
    /// True if `masked_oncs` hides reservations (SPDK's `reservs`): ONCS does not show them,
    /// and the reservation commands are invalid opcodes, as in SPDK.
    pub fn reservations_masked(&self) -> bool {
        self.extra
            .get("masked_oncs")
            .and_then(|v| v.as_array())
            .is_some_and(|a| a.iter().any(|n| n.as_str() == Some("reservs")))
    }
}

impl Default for TransportOpts {
    fn default() -> Self {
        Self {
            max_queue_depth: DEFAULT_MAX_QUEUE_DEPTH,
            max_aq_depth: DEFAULT_MAX_AQ_DEPTH,
            max_qpairs_per_ctrlr: DEFAULT_MAX_QPAIRS_PER_CTRLR,
            in_capsule_data_size: DEFAULT_IN_CAPSULE_DATA,
            max_io_size: DEFAULT_MAX_IO_SIZE,
            io_unit_size: 131_072,
            max_h2c_data: DEFAULT_MAXH2CDATA,
            c2h_success: true,
            sock_priority: 0,
            abort_timeout_sec: 1,
            extra: serde_json::Map::new(),
        }
    }
}

/// ANA state of a listener for one ANA group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnaState {
    /// Optimized.
    Optimized,
    /// Non-optimized.
    NonOptimized,
    /// Inaccessible.
    Inaccessible,
    /// Persistent loss.
    PersistentLoss,
    /// Change in progress.
    Change,
}

impl AnaState {
    /// SPDK's RPC name.
    pub fn name(self) -> &'static str {
        match self {
            AnaState::Optimized => "optimized",
            AnaState::NonOptimized => "non_optimized",
            AnaState::Inaccessible => "inaccessible",
            AnaState::PersistentLoss => "persistent_loss",
            AnaState::Change => "change",
        }
    }

    /// Parses SPDK's RPC name.
    pub fn parse(s: &str) -> Option<AnaState> {
        Some(match s {
            "optimized" => AnaState::Optimized,
            "non_optimized" => AnaState::NonOptimized,
            "inaccessible" => AnaState::Inaccessible,
            "persistent_loss" => AnaState::PersistentLoss,
            "change" => AnaState::Change,
            _ => return None,
        })
    }

    /// The state's code in the ANA log page.
    pub fn code(self) -> u8 {
        use crate::spec::log::ana_state;
        match self {
            AnaState::Optimized => ana_state::OPTIMIZED,
            AnaState::NonOptimized => ana_state::NON_OPTIMIZED,
            AnaState::Inaccessible => ana_state::INACCESSIBLE,
            AnaState::PersistentLoss => ana_state::PERSISTENT_LOSS,
            AnaState::Change => ana_state::CHANGE,
        }
    }

    /// True if I/O may be served in this state.
    pub fn serves_io(self) -> bool {
        matches!(self, AnaState::Optimized | AnaState::NonOptimized)
    }
}

/// A transport address (SPDK's `listen_address`): TCP only.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Trid {
    /// "IPv4" or "IPv6".
    pub adrfam: String,
    /// Address.
    pub traddr: String,
    /// Port.
    pub trsvcid: String,
}

impl Trid {
    /// `traddr:trsvcid` (`[traddr]:trsvcid` for IPv6), the socket address to bind.
    pub fn socket_addr(&self) -> String {
        if self.adrfam.eq_ignore_ascii_case("ipv6") {
            format!("[{}]:{}", self.traddr, self.trsvcid)
        } else {
            format!("{}:{}", self.traddr, self.trsvcid)
        }
    }

    /// SPDK's JSON form.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({"trtype": "TCP", "adrfam": self.adrfam, "traddr": self.traddr, "trsvcid": self.trsvcid})
    }
}

/// A subsystem's listener with its ANA states (per ANA group; groups not listed are optimized).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubListener {
    /// Where.
    pub trid: Trid,
    /// ANA state per ANA group ID.
    pub ana: BTreeMap<u32, AnaState>,
}

impl SubListener {
    /// The ANA state of group `grp` here.
    pub fn ana_state(&self, grp: u32) -> AnaState {
        self.ana.get(&grp).copied().unwrap_or(AnaState::Optimized)
    }
}

/// A namespace: a bdev opened for the subsystem.
pub struct Namespace {
    /// Namespace ID.
    pub nsid: u32,
    /// The bdev's name as given.
    pub bdev_name: String,
    /// The open descriptor (channels are taken from it on each reactor).
    pub desc: BdevDesc,
    /// NGUID (zero: none).
    pub nguid: [u8; 16],
    /// EUI-64 (zero: none).
    pub eui64: [u8; 8],
    /// UUID (zero: none).
    pub uuid: [u8; 16],
    /// ANA group.
    pub anagrpid: u32,
    /// Where the bdev's reservations persist through power loss (SPDK's `ptpl_file`); None:
    /// Persist Through Power Loss is refused.
    pub ptpl_file: Option<String>,
}

impl Namespace {
    /// The namespace's bdev.
    pub fn bdev(&self) -> &Bdev {
        self.desc.bdev()
    }
}

/// What queue pairs of a subsystem read without taking the tables' lock.
#[derive(Default)]
pub struct SubsysShared {
    /// Bumped whenever a namespace is added or removed, or an ANA state changes.
    pub epoch: AtomicU64,
}

impl SubsysShared {
    /// Bumps the epoch.
    pub fn bump(&self) {
        self.epoch.fetch_add(1, Ordering::Release);
    }
}

/// A subsystem.
pub struct Subsystem {
    /// Its NQN.
    pub nqn: String,
    /// The discovery subsystem (Ferrite has exactly one, not listed by nvmf_get_subsystems).
    pub discovery: bool,
    /// Serial number (SN).
    pub serial: String,
    /// Model number (MN).
    pub model: String,
    /// Any host may connect.
    pub allow_any_host: bool,
    /// Hosts allowed.
    pub hosts: BTreeSet<String>,
    /// Listeners.
    pub listeners: Vec<SubListener>,
    /// Namespaces by NSID.
    pub namespaces: BTreeMap<u32, Arc<Namespace>>,
    /// Most namespaces (0 as given means the default bound).
    pub max_namespaces: u32,
    /// `max_namespaces` as given (0 when not).
    pub max_namespaces_given: u32,
    /// Lowest controller ID handed out.
    pub min_cntlid: u16,
    /// Highest controller ID handed out.
    pub max_cntlid: u16,
    /// ANA reporting enabled.
    pub ana_reporting: bool,
    /// Next controller ID to try.
    pub next_cntlid: u16,
    /// Live controllers by ID.
    pub ctrlrs: BTreeMap<u16, Arc<Ctrlr>>,
    /// Shared with queue pairs.
    pub shared: Arc<SubsysShared>,
}

impl Subsystem {
    /// A subsystem with SPDK's defaults.
    pub fn new(nqn: &str, discovery: bool) -> Subsystem {
        Subsystem {
            nqn: nqn.to_string(),
            discovery,
            serial: "00000000000000000000".into(),
            model: "Ferrite NVMe Controller".into(),
            allow_any_host: discovery,
            hosts: BTreeSet::new(),
            listeners: Vec::new(),
            namespaces: BTreeMap::new(),
            max_namespaces: DEFAULT_MAX_NAMESPACES,
            max_namespaces_given: 0,
            min_cntlid: 1,
            max_cntlid: MAX_CNTLID,
            ana_reporting: false,
            next_cntlid: 1,
            ctrlrs: BTreeMap::new(),
            shared: Arc::new(SubsysShared::default()),
        }
    }

    /// True if `hostnqn` may connect.
    pub fn host_allowed(&self, hostnqn: &str) -> bool {
        self.allow_any_host || self.hosts.contains(hostnqn)
    }

    /// True if the subsystem listens on `trid`.
    pub fn listens_on(&self, trid: &Trid) -> bool {
        self.listeners.iter().any(|l| &l.trid == trid)
    }

    /// The listener for `trid`.
    pub fn listener(&self, trid: &Trid) -> Option<&SubListener> {
        self.listeners.iter().find(|l| &l.trid == trid)
    }

    /// A free controller ID in [min_cntlid, max_cntlid], or None if all are taken.
    pub fn take_cntlid(&mut self) -> Option<u16> {
        let span = u32::from(self.max_cntlid - self.min_cntlid) + 1;
        for _ in 0..span {
            let id = self.next_cntlid.clamp(self.min_cntlid, self.max_cntlid);
            self.next_cntlid = if id >= self.max_cntlid { self.min_cntlid } else { id + 1 };
            if !self.ctrlrs.contains_key(&id) {
                return Some(id);
            }
        }
        None
    }

    /// The lowest free NSID, or None if the subsystem is full.
    pub fn free_nsid(&self) -> Option<u32> {
        (1..=self.max_namespaces).find(|n| !self.namespaces.contains_key(n))
    }

    /// ANA group IDs in use (each namespace's), ascending.
    pub fn ana_groups(&self) -> BTreeSet<u32> {
        self.namespaces.values().map(|n| n.anagrpid).collect()
    }
}

/// A discovery referral (`nvmf_discovery_add_referral`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Referral {
    /// Where the other discovery service listens.
    pub trid: Trid,
    /// Subsystem NQN of the referral (the discovery NQN unless given).
    pub subnqn: String,
    /// Secure channel required.
    pub secure_channel: bool,
}

/// Everything the target knows (one per engine).
pub struct Tables {
    /// The TCP transport, once created.
    pub transport: Option<TransportOpts>,
    /// Subsystems by NQN (the discovery subsystem included).
    pub subsystems: BTreeMap<String, Subsystem>,
    /// Discovery referrals.
    pub referrals: Vec<Referral>,
    /// Discovery log generation counter (bumped when what discovery shows changes).
    pub genctr: u64,
}

impl Default for Tables {
    fn default() -> Self {
        let mut subsystems = BTreeMap::new();
        subsystems.insert(nqn::DISCOVERY_NQN.to_string(), Subsystem::new(nqn::DISCOVERY_NQN, true));
        Tables { transport: None, subsystems, referrals: Vec::new(), genctr: 0 }
    }
}

/// The engine's tables, locked.
pub fn tables() -> ferrite_reactor::StateGuard<Tables> {
    ferrite_reactor::lock_state::<Tables>()
}

impl Tables {
    /// The subsystem `nqn`.
    pub fn subsystem(&self, nqn: &str) -> Option<&Subsystem> {
        self.subsystems.get(nqn)
    }

    /// The subsystem `nqn`, to change.
    pub fn subsystem_mut(&mut self, nqn: &str) -> Option<&mut Subsystem> {
        self.subsystems.get_mut(nqn)
    }

    /// The transport's options (the defaults if none was created: connections exist only on
    /// listeners, which need the transport).
    pub fn transport_opts(&self) -> TransportOpts {
        self.transport.clone().unwrap_or_default()
    }

    /// Every listener address of every subsystem, deduplicated.
    pub fn listen_addrs(&self) -> BTreeSet<Trid> {
        self.subsystems.values().flat_map(|s| s.listeners.iter().map(|l| l.trid.clone())).collect()
    }
}
