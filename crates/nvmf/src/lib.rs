//! NVMe over Fabrics: the NVMe/TCP transport (PDUs, digests), the NVMe data structures a
//! controller speaks (commands, completions, identify data, log pages, features), and, built on
//! them, the target that exports bdevs and the host that attaches remote namespaces as bdevs.
//!
//! The layout follows SPDK's split: `spec` is the wire format of NVMe itself (what SPDK keeps in
//! include/spdk/nvme_spec.h and nvmf_spec.h), `tcp` the transport's framing, `target` the
//! NVMe-oF target (SPDK's lib/nvmf).

pub mod rx;
pub mod spec;
pub mod target;
pub mod tcp;
