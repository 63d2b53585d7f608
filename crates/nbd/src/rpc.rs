//! The NBD server's JSON-RPC methods (Ferrite's own; SPDK has none for an NBD server), named in
//! SPDK's style: nbd_server_start/stop, nbd_server_add_export/remove_export,
//! nbd_server_get_exports, nbd_server_get_connections. Kept by save_config as the "nbd"
//! subsystem.
//!
//! `nbd_server_start {address, handshake_max_seconds?, max_connections?}` answers
//! `{"address": BOUND}`, the address it listens on (with port 0, the port the kernel picked);
//! the two limits take QEMU's parameter names (`handshake-max-seconds`, `max-connections`), 0
//! seconds meaning no limit. `nbd_server_stop` of the last running server also removes every
//! export and closes their connections (like QEMU's `nbd-server-stop`), so neither
//! `nbd_server_get_exports` nor save_config lists exports that nothing serves.

use crate::{conn, export, server};
use ferrite_rpc::{errno_error, Registry, RpcError, Subsystem};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Address {
    /// The server's address.
    address: String,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Start {
    /// `host:port` for TCP or a path for a unix socket.
    #[schemars(example = &"127.0.0.1:10809")]
    address: String,
    /// Seconds a client has for its handshake.
    handshake_max_seconds: Option<u32>,
    /// Most connections at once.
    max_connections: Option<usize>,
}

impl Start {
    fn options(&self) -> server::ServerOptions {
        let d = server::ServerOptions::default();
        server::ServerOptions {
            handshake_timeout: match self.handshake_max_seconds {
                None => d.handshake_timeout,
                Some(0) => None,
                Some(s) => Some(std::time::Duration::from_secs(s as u64)),
            },
            max_connections: self.max_connections.unwrap_or(d.max_connections),
        }
    }
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct AddExport {
    /// The bdev to export.
    #[schemars(example = &"Malloc0")]
    bdev_name: String,
    /// The export's name (the bdev's if not given).
    name: Option<String>,
    /// Read-only export.
    read_only: Option<bool>,
    /// The export's description (NBD_INFO_DESCRIPTION).
    description: Option<String>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Name {
    /// The export.
    name: String,
}

fn invalid(msg: String) -> RpcError {
    errno_error(libc::EINVAL, msg)
}

/// Registers the methods and the "nbd" subsystem.
pub fn register(reg: &mut Registry) {
    reg.typed("nbd_server_start", "Starts the NBD server on a TCP or unix socket address.", |_, a: Start| async move {
        let bound = server::start(&a.address, a.options()).map_err(invalid)?;
        Ok(json!({ "address": bound }))
    });
    reg.typed(
        "nbd_server_stop",
        "Stops the NBD server on an address (its connections are closed).",
        |ctx, a: Address| async move {
            server::stop(&a.address).map_err(|e| errno_error(libc::ENOENT, e))?;
            if server::addresses().is_empty() {
                // The NBD server is gone as a whole: so are its exports.
                let names = export::remove_all();
                if !names.is_empty() {
                    let n = names.clone();
                    let closed: usize = ctx
                        .engine
                        .on_all(move |_| n.iter().map(|name| conn::close_export_local(name)).sum::<usize>())
                        .await
                        .unwrap_or_default()
                        .iter()
                        .sum();
                    log::info!("last nbd server stopped: removed exports {names:?} ({closed} connection(s) closed)");
                }
            }
            Ok(json!(true))
        },
    );
    reg.typed("nbd_server_add_export", "Exports a bdev over NBD under a name.", |_, a: AddExport| async move {
        let Some(bdev) = ferrite_bdev::lookup(&a.bdev_name) else {
            return Err(errno_error(libc::ENODEV, format!("No such device: bdev {} not found", a.bdev_name)));
        };
        let name = a.name.unwrap_or_else(|| a.bdev_name.clone());
        if name.is_empty() || name.len() > crate::proto::MAX_NAME_LEN {
            return Err(invalid(format!("export name must be 1 to {} bytes", crate::proto::MAX_NAME_LEN)));
        }
        if name.chars().any(|c| c.is_control()) {
            // They would go raw into logs and into every client's export list.
            return Err(invalid(format!("export name {name:?} contains control characters")));
        }
        if bdev.claimed_by().is_some() && !a.read_only.unwrap_or(false) {
            // Clients could never open it for writing: say so now, not at every GO.
            return Err(errno_error(
                libc::EPERM,
                format!(
                    "bdev {} is claimed by module {}; export it read-only",
                    bdev.name(),
                    bdev.claimed_by().unwrap_or_default()
                ),
            ));
        }
        export::add(export::Export {
            name: name.clone(),
            // The bdev's own name, not the alias it was named by: a renamed lvol keeps it.
            bdev: bdev.name().to_string(),
            bdev_id: bdev.id(),
            read_only: a.read_only.unwrap_or(false),
            description: a.description.unwrap_or_default(),
        })
        .map_err(|e| errno_error(libc::EEXIST, e))?;
        Ok(json!(name))
    });
    reg.typed(
        "nbd_server_remove_export",
        "Removes an NBD export (its connections are closed).",
        |ctx, a: Name| async move {
            export::remove(&a.name).ok_or_else(|| errno_error(libc::ENOENT, format!("no export named {}", a.name)))?;
            let name = a.name.clone();
            let closed: usize =
                ctx.engine.on_all(move |_| conn::close_export_local(&name)).await.unwrap_or_default().iter().sum();
            log::info!("removed nbd export {} ({closed} connection(s) closed)", a.name);
            Ok(json!(true))
        },
    );
    reg.bare("nbd_server_get_exports", "The NBD exports and their connections.", |_| async move {
        let conns = export::connections();
        Ok(Value::Array(
            export::list()
                .into_iter()
                .map(|e| {
                    let n = conns.iter().filter(|c| c.export.as_deref() == Some(e.name.as_str())).count();
                    // As clients see it: also read-only where the bdev takes no writes.
                    let read_only = e.read_only
                        || ferrite_bdev::lookup(&e.bdev).is_some_and(|b| !b.supports(ferrite_bdev::IoType::Write));
                    json!({"name": e.name, "bdev_name": e.bdev, "read_only": read_only,
                        "description": e.description, "connections": n})
                })
                .collect(),
        ))
    });
    reg.bare("nbd_server_get_connections", "The NBD connections.", |_| async move {
        Ok(Value::Array(
            export::connections()
                .into_iter()
                .map(|c| json!({"id": c.id, "export": c.export, "reactor": c.reactor, "peer": c.peer, "listen": c.listen}))
                .collect(),
        ))
    });
    reg.subsystem(Subsystem {
        name: "nbd",
        depends_on: vec!["bdev"],
        config: Arc::new(|| {
            // Servers live on the first reactor; save_config runs there.
            let d = server::ServerOptions::default();
            let mut v: Vec<Value> = server::servers()
                .into_iter()
                .map(|(a, o)| {
                    let mut params = json!({"address": a});
                    if o.handshake_timeout != d.handshake_timeout {
                        params["handshake_max_seconds"] = json!(o.handshake_timeout.map_or(0, |t| t.as_secs()));
                    }
                    if o.max_connections != d.max_connections {
                        params["max_connections"] = json!(o.max_connections);
                    }
                    json!({"method": "nbd_server_start", "params": params})
                })
                .collect();
            v.extend(export::list().into_iter().map(|e| {
                json!({"method": "nbd_server_add_export", "params": {"bdev_name": e.bdev, "name": e.name,
                    "read_only": e.read_only, "description": e.description}})
            }));
            v
        }),
    });
}

/// Stops every listener and closes every connection (daemon shutdown; call on the first
/// reactor).
pub async fn shutdown(engine: &ferrite_reactor::Engine) {
    server::stop_all();
    let _ = engine.on_all(|_| conn::close_all_local()).await;
}
