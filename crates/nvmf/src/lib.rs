//! The NVMe-oF target (SPDK's lib/nvmf): subsystems, controllers and NVMe/TCP queue pairs that
//! export bdevs. The wire format and the NVMe/TCP codec it speaks are `ferrite-nvme`'s (shared
//! with the host), re-exported here as `spec` and `tcp` (the receive side, `rx`, is the target kit's).

pub use ferrite_nvme::{spec, tcp};
pub use ferrite_target::rx;
pub mod target;
