//! The nexus's JSON-RPC methods, in SPDK's style (Mayastor's names): `nexus_create`,
//! `nexus_destroy`, `nexus_add_child`, `nexus_remove_child`, `nexus_fault_child`,
//! `nexus_online_child`, `nexus_get_nexuses`, `nexus_rebuild_pause`, `nexus_rebuild_resume`,
//! `nexus_rebuild_stop`, `nexus_rebuild_get_stats`, `nexus_set_rebuild_rate`, `nexus_publish`,
//! `nexus_unpublish` and
//! `nexus_set_options` (the default store). Errors are SPDK's: -errno with a message, and
//! "Invalid parameters" for params that do not decode.

use crate::nexus::{self, CreateOpts};
use crate::store::Store;
use ferrite_bdev::BdevError;
use ferrite_rpc::jsonrpc::INVALID_PARAMS;
use ferrite_rpc::{errno_error, Registry, RpcError};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;

fn err(e: BdevError) -> RpcError {
    errno_error(e.errno(), e.to_string())
}

fn bad(msg: impl Into<String>) -> RpcError {
    RpcError::new(INVALID_PARAMS, format!("Invalid parameters: {}", msg.into()))
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Create {
    /// Name of the nexus (its bdev).
    #[schemars(example = &"nexus0")]
    name: String,
    /// The volume's UUID (random if not given).
    uuid: Option<String>,
    /// Size in bytes (at most the smallest child's).
    #[serde(default)]
    size: u64,
    /// Children by URI (`bdev:///name`, `malloc:///...`, `uring:///path`, `nvmf://...`).
    #[schemars(example = two_malloc_children())]
    children: Vec<String>,
    /// NVMe reservation key for `nvmf://` children (0: no fencing).
    #[serde(default)]
    resv_key: u64,
    /// Key to preempt when acquiring the reservation.
    #[serde(default)]
    preempt_key: u64,
    /// NVMe reservation type to acquire.
    resv_type: Option<u8>,
    /// Read from local children first.
    #[serde(default)]
    local_first: bool,
    /// Health store (a file, `etcd://...` or `memory://`); the module's if not given.
    store: Option<String>,
    /// Rebuild window in KiB.
    rebuild_window_kb: Option<u32>,
    /// Rebuild rate bound in MB/s (0: none).
    #[serde(default)]
    rebuild_max_mb_sec: u32,
    /// Every this many ms, faulted children that failed on their own (I/O error, gone, failed
    /// rebuild) are probed and rebuilt once they answer (0: only by nexus_online_child).
    #[serde(default)]
    auto_online_ms: u32,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Name {
    /// The nexus.
    name: String,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Child {
    /// The nexus.
    name: String,
    /// The child's URI.
    uri: String,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Get {
    /// Only this nexus.
    name: Option<String>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Rate {
    /// The nexus.
    name: String,
    /// Rebuild rate bound in MB/s (0: none).
    max_mb_sec: u32,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Publish {
    /// The nexus.
    name: String,
    /// `nvmf` only.
    protocol: Option<String>,
    /// Address to listen on (`host:port`).
    traddr: Option<String>,
    /// A string (SPDK's type) or a number.
    trsvcid: Option<Value>,
    /// Mayastor's name for the port.
    port: Option<u16>,
    /// The subsystem's NQN (`nqn.2019-05.io.openebs:<uuid>` if not given).
    nqn: Option<String>,
    /// ANA state of the listener.
    ana_state: Option<String>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct SetOptions {
    /// Default health store of nexuses.
    store: Option<String>,
}

fn nexus_of(name: &str) -> Result<std::sync::Arc<nexus::Nexus>, RpcError> {
    nexus::find(name).ok_or_else(|| errno_error(libc::ENODEV, format!("nexus {name} not found")))
}

/// Registers the nexus methods.
pub fn register(reg: &mut Registry) {
    reg.typed(
        "nexus_create",
        "Creates a nexus (a replicated volume) over children named by URI.",
        |ctx, c: Create| async move {
            let uuid = match c.uuid.as_deref() {
                None | Some("") => None,
                Some(s) => Some(uuid::Uuid::parse_str(s).map_err(|e| bad(format!("uuid {s:?}: {e}")))?),
            };
            let store = c.store.as_deref().map(Store::parse).transpose().map_err(bad)?;
            let resv_type = c.resv_type.unwrap_or(ferrite_nvme::spec::resv::rtype::WRITE_EXCLUSIVE_ALL_REGS);
            if !(1..=6).contains(&resv_type) {
                return Err(bad(format!("resv_type {resv_type} (1 to 6)")));
            }
            let n = nexus::create(
                &ctx,
                CreateOpts {
                    name: c.name,
                    uuid,
                    size: c.size,
                    children: c.children,
                    resv_key: c.resv_key,
                    preempt_key: c.preempt_key,
                    resv_type,
                    local_first: c.local_first,
                    store,
                    rebuild_window_kb: c.rebuild_window_kb.unwrap_or(1024),
                    rebuild_max_mb_sec: c.rebuild_max_mb_sec,
                    auto_online_ms: c.auto_online_ms,
                },
            )
            .await
            .map_err(err)?;
            Ok(json!(n.name))
        },
    );
    reg.typed(
        "nexus_destroy",
        "Destroys a nexus (its children are closed, its publication removed).",
        |ctx, n: Name| async move {
            nexus::destroy(&ctx, &n.name).await.map_err(err)?;
            Ok(json!(true))
        },
    );
    reg.typed(
        "nexus_add_child",
        "Adds a child to a nexus; it is rebuilt from the healthy ones.",
        |ctx, c: Child| async move {
            nexus::add_child(&ctx, &c.name, &c.uri).await.map_err(err)?;
            Ok(json!(true))
        },
    );
    reg.typed("nexus_remove_child", "Removes a child from a nexus.", |ctx, c: Child| async move {
        nexus::remove_child(&ctx, &c.name, &c.uri).await.map_err(err)?;
        Ok(json!(true))
    });
    reg.typed("nexus_fault_child", "Marks a child of a nexus faulted.", |_, c: Child| async move {
        nexus::fault_child(&c.name, &c.uri).await.map_err(err)?;
        Ok(json!(true))
    });
    reg.typed(
        "nexus_online_child",
        "Brings a faulted or offline child back; it is rebuilt (partially when the segment log allows).",
        |ctx, c: Child| async move {
            nexus::online_child(&ctx, &c.name, &c.uri).await.map_err(err)?;
            Ok(json!(true))
        },
    );
    reg.typed(
        "nexus_get_nexuses",
        "Every nexus, or the one named, with its children's states.",
        |ctx, g: Get| async move {
            let list = match &g.name {
                Some(n) => vec![nexus_of(n)?],
                None => nexus::all(),
            };
            let mut out = Vec::new();
            for n in list {
                let mut v = n.info();
                v["published"] = json!(crate::publish::uris(&ctx, &n).await);
                out.push(v);
            }
            Ok(Value::Array(out))
        },
    );
    reg.typed("nexus_rebuild_pause", "Pauses a child's rebuild.", |_, c: Child| async move {
        let j = crate::rebuild::running(&*nexus_of(&c.name)?, &c.uri).map_err(err)?;
        j.ctl.paused.store(true, Ordering::Release);
        Ok(json!(true))
    });
    reg.typed("nexus_rebuild_resume", "Resumes a child's paused rebuild.", |_, c: Child| async move {
        let j = crate::rebuild::running(&*nexus_of(&c.name)?, &c.uri).map_err(err)?;
        j.ctl.paused.store(false, Ordering::Release);
        Ok(json!(true))
    });
    reg.typed("nexus_rebuild_stop", "Stops a child's rebuild.", |_, c: Child| async move {
        let j = crate::rebuild::running(&*nexus_of(&c.name)?, &c.uri).map_err(err)?;
        j.cancel();
        j.wait().await;
        Ok(json!(true))
    });
    reg.typed("nexus_rebuild_get_stats", "The progress of a child's rebuild.", |_, c: Child| async move {
        let j = crate::rebuild::job(&*nexus_of(&c.name)?, &c.uri).map_err(err)?;
        Ok(j.stats())
    });
    reg.typed("nexus_set_rebuild_rate", "Sets the rate bound of a nexus's rebuilds.", |_, r: Rate| async move {
        let n = nexus_of(&r.name)?;
        n.rebuild_max_mb_sec.store(r.max_mb_sec, Ordering::Relaxed);
        for c in n.lock().slots.iter().flatten() {
            if let Some(j) = &c.rebuild {
                j.ctl.max_mb_sec.store(r.max_mb_sec, Ordering::Relaxed);
            }
        }
        Ok(json!(true))
    });
    reg.typed(
        "nexus_publish",
        "Publishes a nexus over NVMe/TCP (subsystem, namespace, listener with an ANA state).",
        |ctx, a: Publish| async move {
            let n = nexus_of(&a.name)?;
            let protocol = a.protocol.as_deref().unwrap_or("nvmf");
            if !protocol.eq_ignore_ascii_case("nvmf") {
                return Err(bad(format!("protocol {protocol:?} (nvmf only)")));
            }
            let port = match (&a.trsvcid, a.port) {
                (Some(Value::String(s)), _) => s.clone(),
                (Some(Value::Number(v)), _) => v.to_string(),
                (Some(other), _) => return Err(bad(format!("trsvcid {other}"))),
                (None, Some(p)) => p.to_string(),
                (None, None) => "4420".to_string(),
            };
            let ana_state = a.ana_state.unwrap_or_else(|| "optimized".into());
            if !["optimized", "non_optimized", "inaccessible"].contains(&ana_state.as_str()) {
                return Err(bad(format!("ana_state {ana_state:?} (optimized, non_optimized or inaccessible)")));
            }
            let o = crate::publish::PublishOpts {
                traddr: a.traddr.unwrap_or_else(|| "127.0.0.1".into()),
                trsvcid: port,
                nqn: a.nqn,
                ana_state,
            };
            let _g = crate::ctl::lock().await;
            let uri = crate::publish::publish(&ctx, &n, &o).await.map_err(err)?;
            Ok(json!(uri))
        },
    );
    reg.typed("nexus_unpublish", "Removes a nexus's NVMe/TCP publication.", |ctx, a: Name| async move {
        let n = nexus_of(&a.name)?;
        let _g = crate::ctl::lock().await;
        crate::publish::unpublish(&ctx, &n).await.map_err(err)?;
        Ok(json!(true))
    });
    reg.typed(
        "nexus_set_options",
        "Sets the nexus module's options (the health store).",
        |_, o: SetOptions| async move {
            let s = o.store.as_deref().map(Store::parse).transpose().map_err(bad)?;
            nexus::set_default_store(s);
            Ok(json!(true))
        },
    );
}

/// The example of a nexus's children: two malloc bdevs made by the nexus.
fn two_malloc_children() -> [&'static str; 2] {
    ["malloc:///m0?size_mb=64", "malloc:///m1?size_mb=64"]
}
