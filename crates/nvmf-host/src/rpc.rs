//! SPDK's bdev_nvme methods for NVMe/TCP controllers: bdev_nvme_attach_controller (answers the
//! names of the bdevs made), bdev_nvme_detach_controller, bdev_nvme_get_controllers.
//! `bdev_nvme_set_options` is an option method (kept by the registry).

use crate::ctrlr::{self, AttachOpts, HostCtrlr};
use ferrite_rpc::{errno_error, Params, Registry, RpcError};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// Attached controllers by name, with their bdevs (one table per engine).
#[derive(Default)]
struct Controllers(Mutex<BTreeMap<String, Attached>>);

/// A controller and the bdevs of its namespaces.
type Attached = (Arc<HostCtrlr>, Vec<String>);

fn controllers() -> Arc<Controllers> {
    ferrite_reactor::engine_state::<Controllers>()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Attach {
    name: String,
    trtype: String,
    traddr: String,
    adrfam: Option<String>,
    #[serde(default, deserialize_with = "port_text")]
    trsvcid: Option<String>,
    subnqn: Option<String>,
    hostnqn: Option<String>,
    #[allow(dead_code)]
    hostaddr: Option<String>,
    #[allow(dead_code)]
    hostsvcid: Option<String>,
    #[allow(dead_code)]
    priority: Option<String>,
    #[allow(dead_code)]
    prchk_reftag: Option<bool>,
    #[allow(dead_code)]
    prchk_guard: Option<bool>,
    hdgst: Option<bool>,
    ddgst: Option<bool>,
    ctrlr_loss_timeout_sec: Option<i64>,
    reconnect_delay_sec: Option<u64>,
    fast_io_fail_timeout_sec: Option<u64>,
    multipath: Option<String>,
    #[allow(dead_code)]
    num_io_queues: Option<u32>,
    #[allow(dead_code)]
    psk: Option<String>,
    #[allow(dead_code)]
    allow_unrecognized_csi: Option<bool>,
    #[allow(dead_code)]
    drives_per_ctrlr: Option<u32>,
}

/// The attach parameters save_config writes for a controller.
pub(crate) fn attach_params(o: &AttachOpts) -> Value {
    json!({"name": o.name, "trtype": "TCP", "adrfam": o.adrfam, "traddr": o.traddr, "trsvcid": o.trsvcid,
        "subnqn": o.subnqn, "hostnqn": o.hostnqn, "hdgst": o.hdgst, "ddgst": o.ddgst,
        "ctrlr_loss_timeout_sec": o.ctrlr_loss_timeout_sec, "reconnect_delay_sec": o.reconnect_delay_sec,
        "fast_io_fail_timeout_sec": o.fast_io_fail_timeout_sec})
}

fn invalid(msg: impl Into<String>) -> RpcError {
    RpcError::invalid_params(msg.into())
}

/// Registers the methods.
pub fn register(reg: &mut Registry) {
    reg.method("bdev_nvme_attach_controller", |_, p: Params| async move {
        let a: Attach = p.parse()?;
        if !a.trtype.eq_ignore_ascii_case("tcp") {
            return Err(invalid(format!("Invalid parameters: trtype {} is not supported (TCP only)", a.trtype)));
        }
        if a.multipath.as_deref().is_some_and(|m| m != "disable" && m != "failover" && m != "multipath") {
            return Err(invalid("Invalid parameters: multipath must be disable, failover or multipath"));
        }
        if controllers().0.lock().unwrap().contains_key(&a.name) {
            return Err(errno_error(libc::EEXIST, format!("A controller named {} already exists", a.name)));
        }
        let loss = a.ctrlr_loss_timeout_sec.unwrap_or(0);
        let delay = a.reconnect_delay_sec.unwrap_or(0);
        if loss != 0 && delay == 0 || loss < -1 {
            return Err(invalid(
                "Invalid parameters: reconnect_delay_sec must be non-zero with ctrlr_loss_timeout_sec",
            ));
        }
        let opts = AttachOpts {
            name: a.name.clone(),
            adrfam: a.adrfam.unwrap_or_else(|| "IPv4".into()),
            traddr: a.traddr,
            trsvcid: a.trsvcid.unwrap_or_else(|| "4420".into()),
            subnqn: a.subnqn.unwrap_or_else(|| ferrite_nvmf::spec::nqn::DISCOVERY_NQN.into()),
            hostnqn: a.hostnqn.unwrap_or_else(|| format!("nqn.2014-08.org.nvmexpress:uuid:{}", uuid::Uuid::new_v4())),
            hdgst: a.hdgst.unwrap_or(false),
            ddgst: a.ddgst.unwrap_or(false),
            ctrlr_loss_timeout_sec: loss,
            reconnect_delay_sec: delay,
            fast_io_fail_timeout_sec: a.fast_io_fail_timeout_sec.unwrap_or(0),
            io_queue_size: 128,
            kato_ms: 10_000,
        };
        let (c, ns) =
            ctrlr::attach(opts).await.map_err(|e| errno_error(libc::EIO, format!("Unable to attach: {e}")))?;
        let names = match crate::bdev::register_namespaces(&c, &ns) {
            Ok(n) => n,
            Err(e) => {
                ctrlr::detach(&c).await;
                return Err(errno_error(e.errno(), e.to_string()));
            }
        };
        log::info!("nvme controller {} attached: bdevs {:?}", a.name, names);
        controllers().0.lock().unwrap().insert(a.name, (c, names.clone()));
        Ok(json!(names))
    });
    reg.method("bdev_nvme_detach_controller", |_, p: Params| async move {
        #[derive(Deserialize)]
        struct Detach {
            name: String,
        }
        let a: Detach = p.parse()?;
        let Some((c, names)) = controllers().0.lock().unwrap().remove(&a.name) else {
            return Err(errno_error(libc::ENODEV, format!("Controller {} not found", a.name)));
        };
        let mut waits = Vec::new();
        for n in &names {
            if let Ok(rx) = ferrite_bdev::unregister(n, Some("nvme")) {
                waits.push(rx);
            }
        }
        for w in waits {
            let _ = w.await;
        }
        ctrlr::detach(&c).await;
        Ok(json!(true))
    });
    reg.method("bdev_nvme_get_controllers", |_, p: Params| async move {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Get {
            name: Option<String>,
        }
        let a: Get = p.parse()?;
        let t = controllers();
        let t = t.0.lock().unwrap();
        if let Some(n) = &a.name {
            if !t.contains_key(n) {
                return Err(errno_error(libc::ENODEV, format!("Controller {n} not found")));
            }
        }
        Ok(Value::Array(
            t.iter()
                .filter(|(n, _)| a.name.as_ref().is_none_or(|x| x == *n))
                .map(|(n, (c, _))| {
                    let o = &c.opts;
                    let state = if c.failed.load(std::sync::atomic::Ordering::Relaxed) {
                        "failed"
                    } else if c.resetting.load(std::sync::atomic::Ordering::Relaxed) {
                        "resetting"
                    } else {
                        "enabled"
                    };
                    json!({"name": n, "ctrlrs": [{"state": state, "cntlid": c.cntlid.load(std::sync::atomic::Ordering::Relaxed),
                        "trid": {"trtype": "TCP", "adrfam": o.adrfam, "traddr": o.traddr, "trsvcid": o.trsvcid, "subnqn": o.subnqn},
                        "host": {"nqn": o.hostnqn, "addr": "", "svcid": ""}}]})
                })
                .collect(),
        ))
    });
}

/// Detaches every controller (daemon shutdown; on the first reactor, after bdevs are gone).
pub async fn shutdown() {
    let all: Vec<Attached> = std::mem::take(&mut *controllers().0.lock().unwrap()).into_values().collect();
    for (c, _) in all {
        ctrlr::detach(&c).await;
    }
}

/// A port given as a string (SPDK's type) or, from `ferrite rpc --trsvcid 4420`, as a number.
fn port_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    match Option::<serde_json::Value>::deserialize(d)? {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(s)),
        Some(serde_json::Value::Number(n)) => Ok(Some(n.to_string())),
        Some(other) => Err(serde::de::Error::custom(format!("trsvcid must be a string, not {other}"))),
    }
}
