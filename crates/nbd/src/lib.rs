//! Ferrite's NBD server: exports any bdev over the NBD protocol (fixed newstyle handshake,
//! simple and structured replies) on TCP and unix sockets.

pub mod conn;
pub mod export;
pub mod handshake;
mod inbox;
pub mod proto;
pub mod rpc;
pub mod server;
pub mod transmission;
