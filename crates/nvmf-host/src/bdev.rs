//! A remote namespace as a bdev (`<controller>n<nsid>`): bdev requests become NVMe commands
//! on this reactor's I/O queue pair to the controller.

use crate::ctrlr::{HostCtrlr, NsInfo};
use ferrite_bdev::{
    register, BackendChannel, Bdev, BdevBackend, BdevError, BdevIo, BdevProps, IoFlags, IoStatus, IoType, IoTypes,
    Limits,
};
use ferrite_nvmf::spec::identify_ctrl::oncs;
use ferrite_nvmf::spec::io::DsmRange;
use ferrite_nvmf::spec::opcode::nvm;
use ferrite_nvmf::spec::sqe::Sqe;
use serde_json::{json, Value};
use std::sync::Arc;

/// Most blocks one command moves (NLB is 16 bits).
const MAX_NLB: u32 = 65_536;

struct NsBackend {
    ctrlr: Arc<HostCtrlr>,
    nsid: u32,
    /// The controller's first namespace writes the attach entry of save_config.
    first: bool,
}

struct NsChannel {
    /// This reactor's path to the controller (looked up once, not per I/O).
    path: std::rc::Rc<crate::ctrlr::IoPath>,
    nsid: u32,
}

fn rw(opcode: u8, nsid: u32, lba: u64, blocks: u64, fua: bool) -> Sqe {
    let mut sqe = Sqe::new(opcode, 0, nsid);
    sqe.cdw10 = lba as u32;
    sqe.cdw11 = (lba >> 32) as u32;
    sqe.cdw12 = (blocks.saturating_sub(1) as u32 & 0xffff) | if fua { 1 << 30 } else { 0 };
    sqe
}

impl BackendChannel for NsChannel {
    fn submit(&mut self, io: BdevIo) {
        let path = &self.path;
        let r = &io.req;
        let fua = r.flags.contains(IoFlags::FUA);
        let (sqe, read, extra) = match r.io_type {
            IoType::Read => (rw(nvm::READ, self.nsid, r.offset_blocks, r.num_blocks, false), true, None),
            IoType::Write => (rw(nvm::WRITE, self.nsid, r.offset_blocks, r.num_blocks, fua), false, None),
            IoType::Compare => (rw(nvm::COMPARE, self.nsid, r.offset_blocks, r.num_blocks, false), false, None),
            IoType::WriteZeroes => (rw(nvm::WRITE_ZEROES, self.nsid, r.offset_blocks, r.num_blocks, fua), false, None),
            IoType::Flush => (Sqe::new(nvm::FLUSH, 0, self.nsid), false, None),
            IoType::Unmap => {
                // One range per 2^32 - 1 blocks.
                let mut ranges = Vec::new();
                let (mut lba, mut left) = (r.offset_blocks, r.num_blocks);
                while left > 0 && ranges.len() < 256 {
                    let n = left.min(u64::from(u32::MAX));
                    ranges.push(DsmRange { context_attributes: 0, nlb: n as u32, slba: lba });
                    lba += n;
                    left -= n;
                }
                let mut buf = ferrite_reactor::alloc_buf(ranges.len() * DsmRange::SIZE);
                DsmRange::write_all(&ranges, &mut buf);
                let mut sqe = Sqe::new(nvm::DATASET_MANAGEMENT, 0, self.nsid);
                sqe.cdw10 = (ranges.len() - 1) as u32;
                sqe.cdw11 = 1 << 2; // deallocate
                (sqe, false, Some(buf))
            }
            IoType::Reset => return io.complete_deferred(IoStatus::Success),
            _ => return io.complete_deferred(IoStatus::Unsupported),
        };
        path.submit(sqe, io, read, extra);
    }
}

impl BdevBackend for NsBackend {
    fn create_channel(&self) -> Result<Box<dyn BackendChannel>, BdevError> {
        Ok(Box::new(NsChannel { path: self.ctrlr.path(), nsid: self.nsid }))
    }

    fn driver_specific(&self) -> Value {
        let o = &self.ctrlr.opts;
        let info = self.ctrlr.info.lock().unwrap().clone();
        json!({"nvme": [{"trid": {"trtype": "TCP", "adrfam": o.adrfam, "traddr": o.traddr, "trsvcid": o.trsvcid,
            "subnqn": o.subnqn}, "ctrlr_data": {"cntlid": self.ctrlr.cntlid.load(std::sync::atomic::Ordering::Relaxed),
            "serial_number": info.sn, "model_number": info.mn, "firmware_revision": info.fr},
            "ns_data": {"id": self.nsid}}]})
    }

    fn config_entry(&self, _bdev: &Bdev) -> Option<Value> {
        self.first.then(
            || json!({"method": "bdev_nvme_attach_controller", "params": crate::rpc::attach_params(&self.ctrlr.opts)}),
        )
    }
}

/// Registers a bdev for each namespace; returns their names.
pub fn register_namespaces(ctrlr: &Arc<HostCtrlr>, ns: &[NsInfo]) -> Result<Vec<String>, BdevError> {
    let info = ctrlr.info.lock().unwrap().clone();
    let mut types = IoTypes::of(&[IoType::Read, IoType::Write, IoType::Flush, IoType::Reset]);
    if info.oncs & oncs::DSM != 0 {
        types = types.with(IoType::Unmap);
    }
    if info.oncs & oncs::WRITE_ZEROES != 0 {
        types = types.with(IoType::WriteZeroes);
    }
    if info.oncs & oncs::COMPARE != 0 {
        types = types.with(IoType::Compare);
    }
    let mut names = Vec::new();
    for (i, n) in ns.iter().enumerate() {
        let max_blocks = if info.max_xfer == 0 { MAX_NLB } else { (info.max_xfer / n.block_size).clamp(1, MAX_NLB) };
        let props = BdevProps {
            name: format!("{}n{}", ctrlr.opts.name, n.nsid),
            aliases: vec![],
            uuid: (n.nguid != [0; 16]).then(|| uuid::Uuid::from_bytes(n.nguid)),
            block_size: n.block_size,
            num_blocks: n.num_blocks,
            product_name: "NVMe disk",
            module: "nvme",
            io_types: types,
            limits: Limits {
                max_io_blocks: max_blocks,
                max_write_zeroes_blocks: u64::from(MAX_NLB),
                max_unmap_blocks: u64::from(u32::MAX),
                ..Limits::default()
            },
        };
        match register(props, Arc::new(NsBackend { ctrlr: ctrlr.clone(), nsid: n.nsid, first: i == 0 })) {
            Ok(b) => names.push(b.name().to_string()),
            Err(e) => {
                for name in &names {
                    let _ = ferrite_bdev::unregister(name, Some("nvme"));
                }
                return Err(e);
            }
        }
    }
    Ok(names)
}
