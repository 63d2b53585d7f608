//! Ferrite's control plane: JSON-RPC 2.0 (SPDK's dialect) on a unix socket, the method registry,
//! and SPDK's JSON config format.

pub mod app;
pub mod client;
pub mod config;
pub mod jsonrpc;
pub mod registry;
pub mod server;

pub use jsonrpc::RpcError;
pub use registry::{errno_error, Ctx, Params, Registry, RpcResult, Subsystem};
