//! A remote namespace as a bdev (`<name>n<nsid>`): one bdev per namespace of a controller name,
//! reached through every controller of the name that has it (multipath), each request sent on
//! a path its channel ([`crate::channel`]) chooses.

use crate::ctrlr::{HostCtrlr, NsInfo};
use crate::group::Group;
use ferrite_bdev::{register, BackendChannel, Bdev, BdevBackend, BdevError, BdevProps, IoType, IoTypes, Limits};
use ferrite_nvme::spec::identify_ctrl::oncs;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// Most blocks one command moves (NLB is 16 bits).
const MAX_NLB: u32 = 65_536;
/// Most ranges in one Dataset Management command (NVMe: NR is 0-based in 8 bits).
pub(crate) const DSM_MAX_RANGES: u32 = 256;

/// A namespace bdev's state shared by its channels.
pub struct NsShared {
    /// NSID.
    pub nsid: u32,
    /// Bdev name.
    pub name: String,
    /// The namespace as the first controller identified it (paths added later must match).
    pub info: NsInfo,
    /// The controllers that reach it, in the order they were attached.
    pub ctrlrs: Mutex<Vec<Arc<HostCtrlr>>>,
    /// The generation of the paths of its name (see [`HostCtrlr::paths_gen`]).
    pub gen: Arc<AtomicU64>,
    /// Multipath policy: active-active (round robin) rather than active-passive.
    pub active_active: AtomicBool,
}

struct NsBackend {
    ns: Arc<NsShared>,
    group: Weak<Group>,
}

impl BdevBackend for NsBackend {
    fn create_channel(&self) -> Result<Box<dyn BackendChannel>, BdevError> {
        Ok(Box::new(crate::channel::NsChannel::new(self.ns.clone())))
    }

    fn driver_specific(&self) -> Value {
        let paths: Vec<Value> = self
            .ns
            .ctrlrs
            .lock()
            .unwrap()
            .iter()
            .map(|c| {
                let info = c.info.lock().unwrap().clone();
                let mut v = json!({"trid": c.active_trid().json(), "ctrlr_data": {
                    "cntlid": c.cntlid.load(Ordering::Relaxed), "serial_number": info.sn,
                    "model_number": info.mn, "firmware_revision": info.fr},
                    "ns_data": {"id": self.ns.nsid}});
                if info.cmic & ferrite_nvme::spec::identify_ctrl::cmic::ANA_REPORTING != 0 {
                    v["ns_data"]["ana_state"] = json!(crate::ana::state_name(c.ana.state(self.ns.nsid)));
                }
                v
            })
            .collect();
        let policy = if self.ns.active_active.load(Ordering::Relaxed) { "active_active" } else { "active_passive" };
        json!({"nvme": paths, "mp_policy": policy})
    }

    fn config_entry(&self, _bdev: &Bdev) -> Option<Value> {
        // The name's first bdev writes every attach of the name (an array: several entries).
        let g = self.group.upgrade()?;
        let first = g.bdevs.lock().unwrap().first().is_some_and(|b| Arc::ptr_eq(b, &self.ns));
        first.then(|| Value::Array(g.config_entries()))
    }
}

/// The I/O types namespace `n` of the controller serves (ONCS); none that write if the
/// namespace is write-protected.
/// What a namespace's bdev does not serve while the namespace is write-protected (NSATTR).
pub(crate) const WRITE_PROTECTED_TYPES: IoTypes = IoTypes::of(&[IoType::Write, IoType::Unmap, IoType::WriteZeroes]);

fn io_types(c: &HostCtrlr, n: &NsInfo) -> IoTypes {
    let info = c.info.lock().unwrap().clone();
    let mut types =
        IoTypes::of(&[IoType::Read, IoType::Write, IoType::Flush, IoType::Reset, IoType::Abort, IoType::NvmeIo]);
    if info.oncs & oncs::DSM != 0 {
        types = types.with(IoType::Unmap);
    }
    if info.oncs & oncs::WRITE_ZEROES != 0 {
        types = types.with(IoType::WriteZeroes);
    }
    if info.oncs & oncs::COMPARE != 0 {
        types = types.with(IoType::Compare);
    }
    if n.write_protected {
        types = IoTypes(types.0 & !WRITE_PROTECTED_TYPES.0);
    }
    types
}

/// Registers a bdev for namespace `n` of `ctrlr`, in `group`.
pub(crate) fn register_namespace(
    group: &Arc<Group>,
    ctrlr: &Arc<HostCtrlr>,
    n: &NsInfo,
) -> Result<Arc<NsShared>, BdevError> {
    let max_xfer = ctrlr.info.lock().unwrap().max_xfer;
    let max_blocks = if max_xfer == 0 { MAX_NLB } else { (max_xfer / n.block_size).clamp(1, MAX_NLB) };
    let ns = Arc::new(NsShared {
        nsid: n.nsid,
        name: format!("{}n{}", group.name, n.nsid),
        info: n.clone(),
        ctrlrs: Mutex::new(vec![ctrlr.clone()]),
        gen: group.gen.clone(),
        active_active: AtomicBool::new(false),
    });
    let uuid = (n.nguid != [0; 16]).then_some(n.nguid).or(n.uuid).map(uuid::Uuid::from_bytes);
    let props = BdevProps {
        name: ns.name.clone(),
        aliases: vec![],
        uuid,
        block_size: n.block_size,
        num_blocks: n.num_blocks,
        product_name: "NVMe disk",
        module: "nvme",
        io_types: io_types(ctrlr, n),
        limits: Limits {
            // MDTS.
            max_io_blocks: max_blocks,
            max_write_zeroes_blocks: u64::from(MAX_NLB),
            // One Dataset Management command: up to 256 ranges of 2^32 - 1 blocks each (the
            // controller's DMRL and DMRSL, from the I/O command set's identify data, are not
            // read: the NVMe limits themselves stand).
            max_unmap_blocks: u64::from(u32::MAX),
            max_unmap_segments: DSM_MAX_RANGES,
            unmap_granularity: n.dealloc_granularity,
            unmap_alignment: n.dealloc_alignment,
            ..Limits::default()
        },
    };
    register(props, Arc::new(NsBackend { ns: ns.clone(), group: Arc::downgrade(group) }))?;
    Ok(ns)
}
