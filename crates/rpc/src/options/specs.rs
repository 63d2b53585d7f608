//! Which SPDK option methods exist, in which subsystem and RPC states, with which decode-error
//! code (SPDK's handlers differ: most answer -32602, some -32603 or even -32700), and what makes
//! two calls set the same thing (e.g. one socket implementation each).

use crate::errno_error;
use crate::jsonrpc::{INTERNAL_ERROR, INVALID_PARAMS, PARSE_ERROR};
use crate::registry::{RUNTIME, STARTUP};
use crate::RpcError;
use serde_json::Value;

/// A further check of an option method's params.
pub type Check = fn(&Value) -> Result<(), RpcError>;

/// One option method.
pub struct Spec {
    /// SPDK's method name.
    pub method: &'static str,
    /// The subsystem whose config lists it.
    pub subsystem: &'static str,
    /// RPC states it may be called in (SPDK's state mask).
    pub states: u8,
    /// Error code when params do not decode (what SPDK's handler answers).
    pub decode_error: i32,
    /// SPDK's handler accepts a call without params.
    pub params_optional: bool,
    /// Member naming the instance the options belong to (calls with different values are kept
    /// apart), if any.
    pub key: Option<&'static str>,
    /// Further checks of what Ferrite can honour.
    pub check: Option<Check>,
}

const fn spec(
    method: &'static str,
    subsystem: &'static str,
    states: u8,
    decode_error: i32,
    params_optional: bool,
) -> Spec {
    Spec { method, subsystem, states, decode_error, params_optional, key: None, check: None }
}

/// Socket implementations SPDK has.
const SOCK_IMPLS: &[&str] = &["posix", "uring", "ssl"];

fn known_sock_impl(p: &Value) -> Result<(), RpcError> {
    match p["impl_name"].as_str() {
        Some(n) if SOCK_IMPLS.contains(&n) => Ok(()),
        other => Err(errno_error(libc::EINVAL, format!("unknown socket implementation {other:?} (posix, uring, ssl)"))),
    }
}

fn static_scheduler(p: &Value) -> Result<(), RpcError> {
    match p["name"].as_str() {
        Some("static") => Ok(()),
        other => Err(RpcError::new(
            INTERNAL_ERROR,
            format!("scheduler {other:?} is not available: Ferrite's threads stay on their reactors (static only)"),
        )),
    }
}

/// `match_any`, or a comma-separated list of transport, address, svcid (SPDK's
/// decode_discovery_filter).
fn discovery_filter(p: &Value) -> Result<(), RpcError> {
    let Some(f) = p.get("discovery_filter").and_then(Value::as_str) else { return Ok(()) };
    let ok = f == "match_any" || f.split(',').all(|t| matches!(t, "transport" | "address" | "svcid"));
    if ok {
        Ok(())
    } else {
        Err(RpcError::new(INVALID_PARAMS, format!("Invalid parameters: discovery_filter {f:?}")))
    }
}

/// Every option method, in the order `save_config` writes them within a subsystem.
pub static SPECS: &[Spec] = &[
    Spec {
        check: Some(static_scheduler),
        ..spec("framework_set_scheduler", "scheduler", STARTUP | RUNTIME, INVALID_PARAMS, false)
    },
    spec("scheduler_set_options", "scheduler", STARTUP, INVALID_PARAMS, false),
    Spec { check: Some(known_sock_impl), ..spec("sock_set_default_impl", "sock", STARTUP, INVALID_PARAMS, false) },
    Spec {
        key: Some("impl_name"),
        check: Some(known_sock_impl),
        ..spec("sock_impl_set_options", "sock", STARTUP, INVALID_PARAMS, false)
    },
    Spec { check: Some(super::iobuf::check), ..spec("iobuf_set_options", "iobuf", STARTUP, INVALID_PARAMS, false) },
    spec("keyring_linux_set_options", "keyring", STARTUP, INVALID_PARAMS, false),
    spec("fsdev_set_opts", "fsdev", RUNTIME, INVALID_PARAMS, false),
    spec("accel_set_options", "accel", STARTUP, PARSE_ERROR, false),
    spec("bdev_set_options", "bdev", STARTUP, INVALID_PARAMS, true),
    spec("bdev_raid_set_options", "bdev", STARTUP | RUNTIME, PARSE_ERROR, true),
    spec("bdev_iscsi_set_options", "bdev", STARTUP | RUNTIME, INTERNAL_ERROR, true),
    spec("bdev_nvme_set_options", "bdev", STARTUP | RUNTIME, INTERNAL_ERROR, true),
    spec("bdev_nvme_set_hotplug", "bdev", RUNTIME, INVALID_PARAMS, false),
    Spec { check: Some(discovery_filter), ..spec("nvmf_set_config", "nvmf", STARTUP, INVALID_PARAMS, true) },
    spec("nvmf_set_max_subsystems", "nvmf", STARTUP, INVALID_PARAMS, true),
    spec("nvmf_set_crdt", "nvmf", STARTUP, INVALID_PARAMS, true),
    spec("iscsi_set_options", "iscsi", STARTUP, INVALID_PARAMS, true),
];
