//! The options and what the engine reports: `iscsi_get_options`, `iscsi_get_connections`,
//! `iscsi_get_stats` (SPDK's shapes; an empty list and zeros until an engine registers its
//! [`crate::Sessions`]).

use super::no_params;
use crate::hooks::{sessions, ConnState};
use crate::state::with_read;
use ferrite_rpc::registry::RUNTIME;
use ferrite_rpc::Registry;
use serde_json::{json, Value};

/// Registers the methods.
pub(super) fn register(reg: &mut Registry) {
    reg.bare_with("iscsi_get_options", RUNTIME, "The iSCSI target's options.", no_params, |_| async move {
        Ok(with_read(|s| s.options.to_json()))
    });
    reg.bare_with("iscsi_get_connections", RUNTIME, "The iSCSI target's connections.", no_params, |_| async move {
        let conns = sessions().map(|s| s.connections()).unwrap_or_default();
        Ok(Value::Array(conns.iter().map(crate::json::connection).collect()))
    });
    reg.bare_with(
        "iscsi_get_stats",
        RUNTIME,
        "How many iSCSI connections are in each state.",
        no_params,
        |_| async move {
            let conns = sessions().map(|s| s.connections()).unwrap_or_default();
            let count = |st: ConnState| conns.iter().filter(|c| c.state == st).count();
            Ok(json!({"invalid": count(ConnState::Invalid), "running": count(ConnState::Running),
            "exiting": count(ConnState::Exiting), "exited": count(ConnState::Exited)}))
        },
    );
}
