//! The NVMe/TCP transport (NVMe/TCP transport specification, NVMe-oF 1.1): PDU framing.
//!
//! - [`pdu`]: the wire layouts (common header, each type's header, flags, field offsets) and
//!   the fatal errors ([`PduError`], with the FES and FEI a termination request carries);
//! - [`digest`]: CRC32C header and data digests;
//! - [`negotiate`]: what ICReq/ICResp settle ([`Negotiated`]).

#![warn(missing_docs)]

pub mod digest;
pub mod negotiate;
pub mod pdu;

pub use negotiate::{controller_accept, host_accept, ControllerConfig, Negotiated};
pub use pdu::{
    C2hData, CapsuleCmd, CapsuleResp, Direction, Fes, H2cData, IcReq, IcResp, Pdu, PduError, PduType, R2t, Role,
    TermReq,
};
