//! Ferrite's control plane: JSON-RPC 2.0 (SPDK's dialect) on a unix socket, the method registry,
//! and SPDK's JSON config format.

pub mod jsonrpc;
