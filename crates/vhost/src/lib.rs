//! vhost-user-blk target: any bdev as a virtio-blk disk of a virtual machine (QEMU,
//! cloud-hypervisor, any vhost-user front end). The front end's messages are handled on one
//! control thread ([`control`], [`backend`]); each virtqueue is served by a reactor
//! ([`vring`]) with the guest's memory ([`memory`]) as the payload of the bdev requests that
//! its chains ([`request`], in virtio-blk's format: [`blk`]) become; its ring ([`ring`]) is split
//! ([`split`]) or packed ([`packed`]); what is in flight is kept where a restarted daemon finds
//! it ([`inflight`]); during a live migration, what the device writes to guest memory is marked
//! in the front end's dirty log ([`dirty`]).

pub mod backend;
pub mod blk;
pub mod coalesce;
pub mod control;
pub mod dirty;
pub mod inflight;
pub mod memory;
pub mod packed;
pub mod request;
pub mod ring;
pub mod rpc;
pub mod shared;
pub mod split;
pub mod vring;
