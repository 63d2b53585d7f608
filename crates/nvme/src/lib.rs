//! NVMe on the wire, for the NVMe/TCP target and host alike (the host does not link the
//! target):
//!
//! - [`spec`]: the wire format of NVMe itself: commands, completions, identify data, log pages,
//!   features, fabrics commands (what SPDK keeps in include/spdk/nvme_spec.h and nvmf_spec.h).
//! - [`tcp`]: the NVMe/TCP transport's framing: PDUs, digests, the decoder and encoder.

pub mod spec;
pub mod tcp;
