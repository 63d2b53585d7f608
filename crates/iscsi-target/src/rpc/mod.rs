//! SPDK's `iscsi_*` JSON-RPC methods (lib/iscsi/iscsi_rpc.c) with SPDK's names, parameters,
//! states, results and error answers: a call SPDK answers with a bare "Invalid parameters"
//! gets that text followed by what is wrong; where SPDK's message is specific ("Could not find
//! portal group 5", ...) it is SPDK's, word for word. Methods run on the first reactor.

mod auth;
mod info;
mod initiator;
mod node;
mod portal;

use crate::model::Refused;
use ferrite_rpc::jsonrpc::INVALID_PARAMS;
use ferrite_rpc::{Params, Registry, RpcError};
use serde::de::DeserializeOwned;
use std::sync::Arc;

/// SPDK's generic refusal, with what is wrong after it.
pub(crate) fn invalid(why: impl std::fmt::Display) -> RpcError {
    RpcError::new(INVALID_PARAMS, format!("Invalid parameters: {why}"))
}

/// A refusal of the model as SPDK's generic refusal.
pub(crate) fn refused(r: Refused) -> RpcError {
    log::warn!("iscsi: {}", r.why);
    invalid(r.why)
}

/// C's `strerror` text of `errno` (what SPDK's messages quote).
pub(crate) fn strerror(errno: i32) -> String {
    let s = std::io::Error::from_raw_os_error(errno).to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

/// Decodes params that SPDK's handler requires (it refuses a call without any, even when every
/// member is optional).
pub(crate) fn parse<T: DeserializeOwned>(_: &'static str, p: Params) -> Result<T, RpcError> {
    if p.0.is_none() {
        return Err(invalid("parameters required"));
    }
    p.parse()
}

/// SPDK's answer to params given to a method that takes none (an empty object counts).
pub(crate) fn no_params(method: &'static str, p: Params) -> Result<(), RpcError> {
    match p.0 {
        None => Ok(()),
        Some(_) => Err(RpcError::new(INVALID_PARAMS, format!("{method} requires no parameters"))),
    }
}

/// Refuses more than `max` entries in array `what` (SPDK's schema counts).
pub(crate) fn at_most<T>(v: &[T], max: usize, what: &str) -> Result<(), RpcError> {
    if v.len() > max {
        return Err(invalid(format!("{what}: at most {max} entries")));
    }
    Ok(())
}

/// Registers `iscsi_set_options`, every `iscsi_*` method and the "iscsi" subsystem.
pub fn register(reg: &mut Registry) {
    reg.option_method(&crate::options::ISCSI_SET_OPTIONS);
    auth::register(reg);
    portal::register(reg);
    initiator::register(reg);
    node::register(reg);
    info::register(reg);
    reg.subsystem(ferrite_rpc::Subsystem {
        name: "iscsi",
        depends_on: vec!["bdev", "sock"],
        config: Arc::new(crate::json::config),
    });
}
