//! iSCSI without I/O (RFC 7143).
#![warn(missing_docs)]

pub mod chap;
pub mod digest;
pub mod keys;
pub mod negotiate;
pub mod pdu;
