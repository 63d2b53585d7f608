//! SPDK's vhost-blk methods: vhost_create_blk_controller (ctrlr, dev_name, cpumask, readonly,
//! packed_ring, transport), vhost_delete_controller, vhost_get_controllers,
//! vhost_controller_set_coalescing; kept by save_config
//! as the "vhost_blk" subsystem. The socket of controller `ctrlr` is `DIR/ctrlr`, DIR being
//! `ferrite serve -S DIR` (default: the working directory, as SPDK's vhost app).

use crate::backend::CtrlrInfo;
use crate::control;
use crate::vring::Device;
use ferrite_rpc::{errno_error, Registry, Subsystem};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::atomic::Ordering;
use std::sync::Arc;

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct CreateBlk {
    /// The controller's name (its socket in the socket directory).
    #[schemars(example = &"vhost.0")]
    ctrlr: String,
    /// The bdev.
    #[schemars(example = &"Malloc0")]
    dev_name: String,
    /// Reactors its queues may run on (a mask or list).
    cpumask: Option<String>,
    /// Read-only device.
    readonly: Option<bool>,
    /// Offer packed virtqueues.
    packed_ring: Option<bool>,
    /// SPDK's transport (`vhost_user_blk` only).
    transport: Option<String>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Ctrlr {
    /// The controller.
    ctrlr: String,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct SetCoalescing {
    /// The controller.
    ctrlr: String,
    /// Base delay of an interrupt (µs; 0: no coalescing).
    delay_base_us: u32,
    /// IOPS above which interrupts are coalesced.
    iops_threshold: u32,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct GetControllers {
    /// Only this controller.
    name: Option<String>,
}

/// The serial a controller's GET_ID answers: the bdev's name, cut or zero-padded to 20 bytes
/// (what SPDK answers).
fn serial(bdev: &str) -> [u8; crate::blk::ID_LEN] {
    let mut s = [0u8; crate::blk::ID_LEN];
    let n = bdev.len().min(s.len());
    s[..n].copy_from_slice(&bdev.as_bytes()[..n]);
    s
}

fn describe(c: &control::Controller) -> Value {
    let dev = &c.info.dev;
    let (delay, iops) = dev.coalescing.get();
    json!({
        "ctrlr": dev.ctrlr,
        "cpumask": c.cpumask,
        "delay_base_us": delay,
        "iops_threshold": iops,
        "socket": c.socket.display().to_string(),
        "sessions": if c.connected.load(Ordering::SeqCst) { json!([{"vid": 0, "id": 0, "name": format!("{}s0", dev.ctrlr), "started": true}]) } else { json!([]) },
        "backend_specific": {"block": {"readonly": dev.readonly, "bdev": dev.bdev, "transport": "vhost_user_blk"}},
    })
}

/// Registers the methods and the "vhost_blk" subsystem.
pub fn register(reg: &mut Registry) {
    reg.typed(
        "vhost_create_blk_controller",
        "Creates a vhost-user-blk controller (a unix socket) over a bdev.",
        |ctx, a: CreateBlk| async move {
            let invalid = |m: String| errno_error(libc::EINVAL, m);
            if a.ctrlr.is_empty() || a.ctrlr.len() > 255 || a.ctrlr.contains('/') || a.ctrlr == "." || a.ctrlr == ".." {
                return Err(invalid(format!("controller name {:?} must be 1 to 255 bytes, not a path", a.ctrlr)));
            }
            if a.ctrlr.chars().any(|c| c.is_control()) {
                return Err(invalid(format!("controller name {:?} contains control characters", a.ctrlr)));
            }
            if let Some(t) = a.transport.as_deref().filter(|t| *t != "vhost_user_blk") {
                return Err(invalid(format!("transport {t} is not available (vhost_user_blk is)")));
            }
            let Some(bdev) = ferrite_bdev::lookup(&a.dev_name) else {
                return Err(errno_error(libc::ENODEV, format!("No such device: bdev {} not found", a.dev_name)));
            };
            let readonly = a.readonly.unwrap_or(false) || !bdev.supports(ferrite_bdev::IoType::Write);
            if bdev.claimed_by().is_some() && !readonly {
                return Err(errno_error(
                    libc::EPERM,
                    format!(
                        "bdev {} is claimed by module {}; export it read-only",
                        bdev.name(),
                        bdev.claimed_by().unwrap_or_default()
                    ),
                ));
            }
            let engine = ctx.engine.clone();
            let all: Vec<usize> = (0..engine.count()).collect();
            let (reactors, cpumask) = match a.cpumask.as_deref() {
                None => (
                    all.clone(),
                    ferrite_reactor::cpumask::format_cpumask(
                        &all.iter().map(|&r| engine.core_of(r)).collect::<Vec<_>>(),
                    ),
                ),
                Some(m) => {
                    let cores =
                        ferrite_reactor::cpumask::parse_cpumask(m).map_err(|e| invalid(format!("cpumask {m}: {e}")))?;
                    let rs: Vec<usize> = all.iter().copied().filter(|&r| cores.contains(&engine.core_of(r))).collect();
                    if rs.is_empty() {
                        return Err(invalid(format!("cpumask {m} has no core this daemon runs a reactor on")));
                    }
                    (rs, m.to_string())
                }
            };
            let dev = Arc::new(Device {
                ctrlr: a.ctrlr.clone(),
                bdev: bdev.name().to_string(),
                readonly,
                packed_ring: a.packed_ring.unwrap_or(false),
                seg_max: crate::backend::SEG_MAX,
                serial: serial(bdev.name()),
                coalescing: Default::default(),
                writeback: true.into(),
            });
            let id = control::next_id();
            let name = a.ctrlr.clone();
            let desc = ferrite_bdev::Bdev::open_ext(bdev.name(), !readonly, move |e| match e {
                ferrite_bdev::BdevEvent::Resize => control::config_changed(id),
                ferrite_bdev::BdevEvent::Remove => {
                    log::warn!("vhost controller {name}: its bdev is being removed; the disk fails I/O from now on");
                    // Dropped after the callback: the layer is in the middle of telling its openers.
                    let name = name.clone();
                    ferrite_reactor::spawn_local(async move {
                        if let Some(c) = control::find(&name) {
                            c.desc.lock().unwrap().take();
                        }
                    })
                    .detach();
                }
                _ => {}
            })
            .map_err(|e| errno_error(e.errno(), format!("bdev {}: {e}", bdev.name())))?;
            let info = Arc::new(CtrlrInfo { id, dev, reactors, engine });
            control::add(info, cpumask, desc).map_err(|e| errno_error(libc::EEXIST, e))?;
            Ok(json!(true))
        },
    );
    reg.typed("vhost_delete_controller", "Deletes a vhost controller.", |_, a: Ctrlr| async move {
        control::remove(&a.ctrlr, false).await.map_err(|(errno, m)| errno_error(errno, m))?;
        Ok(json!(true))
    });
    reg.typed(
        "vhost_controller_set_coalescing",
        "Sets a vhost controller's interrupt coalescing.",
        |_, a: SetCoalescing| async move {
            let c = control::find(&a.ctrlr)
                .ok_or_else(|| errno_error(libc::ENODEV, format!("controller {} not found", a.ctrlr)))?;
            c.info.dev.coalescing.set(a.delay_base_us, a.iops_threshold).map_err(|e| errno_error(libc::EINVAL, e))?;
            Ok(json!(true))
        },
    );
    reg.typed(
        "vhost_get_controllers",
        "The vhost controllers, or the one named.",
        |ctx, a: GetControllers| async move {
            let mut all = control::controllers();
            if let Some(n) = &a.name {
                all.retain(|c| &c.info.dev.ctrlr == n);
                if all.is_empty() {
                    return Err(errno_error(libc::ENODEV, format!("controller {n} not found")));
                }
            }
            let mut out = Vec::new();
            for c in all {
                let mut v = describe(&c);
                // Ferrite's addition: each queue's state, from the reactor that serves it.
                let mut queues = Vec::new();
                let mut reactors = c.info.reactors.clone();
                reactors.dedup();
                for r in reactors {
                    let id = c.info.id;
                    if let Ok(s) = ctx.engine.call(r, move || crate::vring::stats(id)).await {
                        queues.extend(s);
                    }
                }
                queues.sort_by_key(|q| q.index);
                v["queues"] = serde_json::to_value(queues).unwrap_or_default();
                out.push(v);
            }
            Ok(Value::Array(out))
        },
    );
    reg.subsystem(Subsystem {
        name: "vhost_blk",
        depends_on: vec!["bdev"],
        config: Arc::new(|| {
            let mut v = Vec::new();
            for c in control::controllers() {
                let d = &c.info.dev;
                let mut create = json!({"method": "vhost_create_blk_controller", "params": {"ctrlr": d.ctrlr,
                    "dev_name": d.bdev, "cpumask": c.cpumask, "readonly": d.readonly, "transport": "vhost_user_blk"}});
                // SPDK v26.05 does not write it (a packed controller comes back split there);
                // written only when set, split controllers' entries stay SPDK's.
                if d.packed_ring {
                    create["params"]["packed_ring"] = json!(true);
                }
                v.push(create);
                // As SPDK: written only when coalescing is on.
                let (delay, iops) = d.coalescing.get();
                if delay != 0 {
                    v.push(json!({"method": "vhost_controller_set_coalescing", "params": {"ctrlr": d.ctrlr,
                        "delay_base_us": delay, "iops_threshold": iops}}));
                }
            }
            v
        }),
    });
}

/// Deletes every controller, disconnecting their front ends (daemon shutdown).
pub async fn shutdown() {
    for c in control::controllers() {
        let _ = control::remove(&c.info.dev.ctrlr, true).await;
    }
}
