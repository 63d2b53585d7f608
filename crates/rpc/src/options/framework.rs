//! The framework's own option methods: the scheduler (`static` only: threads never move between
//! reactors), sockets (implementations SPDK knows), the reactors' buffer pools (`iobuf`, see
//! [`super::iobuf`]), and keyring, fsdev and accel options kept for `save_config`.

use super::spec::{OptionMethod, Spec};
use crate::errno_error;
use crate::jsonrpc::{RpcError, INTERNAL_ERROR, INVALID_PARAMS, PARSE_ERROR};
use crate::registry::{RUNTIME, STARTUP};
use serde_json::Value;

/// SPDK's schema of these methods.
const SCHEMA: &str = include_str!("framework.schema.json");
/// SPDK's defaults of these methods.
const DEFAULTS: &str = include_str!("framework.defaults.json");

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

const fn method(spec: Spec) -> OptionMethod {
    OptionMethod::new(spec, SCHEMA, DEFAULTS)
}

/// The framework's option methods.
pub static METHODS: [OptionMethod; 8] = [
    OptionMethod {
        inert: &["period"],
        ..method(Spec {
            check: Some(static_scheduler),
            ..Spec::new("framework_set_scheduler", "scheduler", STARTUP | RUNTIME, INVALID_PARAMS, false)
        })
    },
    method(Spec::new("scheduler_set_options", "scheduler", STARTUP, INVALID_PARAMS, false)),
    OptionMethod {
        inert: &["impl_name"],
        ..method(Spec {
            check: Some(known_sock_impl),
            ..Spec::new("sock_set_default_impl", "sock", STARTUP, INVALID_PARAMS, false)
        })
    },
    OptionMethod {
        inert: &["*"],
        ..method(Spec {
            key: Some("impl_name"),
            check: Some(known_sock_impl),
            ..Spec::new("sock_impl_set_options", "sock", STARTUP, INVALID_PARAMS, false)
        })
    },
    // The reactors' buffer pools are made from these when the framework starts (`iobuf`).
    OptionMethod {
        honoured: &["small_pool_count", "large_pool_count", "small_bufsize", "large_bufsize"],
        ..method(Spec {
            check: Some(super::iobuf::check),
            ..Spec::new("iobuf_set_options", "iobuf", STARTUP, INVALID_PARAMS, false)
        })
    },
    method(Spec::new("keyring_linux_set_options", "keyring", STARTUP, INVALID_PARAMS, false)),
    OptionMethod { inert: &["*"], ..method(Spec::new("fsdev_set_opts", "fsdev", RUNTIME, INVALID_PARAMS, false)) },
    OptionMethod { inert: &["*"], ..method(Spec::new("accel_set_options", "accel", STARTUP, PARSE_ERROR, false)) },
];
