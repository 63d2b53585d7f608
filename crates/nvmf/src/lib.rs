//! The NVMe-oF target (SPDK's lib/nvmf): subsystems, controllers and NVMe/TCP queue pairs that
//! export bdevs. The wire format and the NVMe/TCP codec it speaks are `ferrite-nvme`'s (shared
//! with the host), re-exported here as `spec`, `tcp` and `rx`.

pub use ferrite_nvme::{rx, spec, tcp};
pub mod target;
