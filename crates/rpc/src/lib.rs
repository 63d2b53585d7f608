//! Ferrite's control plane: JSON-RPC 2.0 (SPDK's dialect) on a unix socket, the method registry
//! with SPDK's RPC states, SPDK's option, log and thread methods, and SPDK's JSON config format.

pub mod app;
pub mod client;
pub mod config;
mod conn;
pub mod jsonrpc;
pub mod logctl;
pub mod options;
pub mod reference;
pub mod registry;
mod reject;
pub mod server;
pub mod sockfile;
pub mod threads;

pub use jsonrpc::RpcError;
pub use registry::{errno_error, Ctx, Params, Registry, RpcResult, Subsystem};
