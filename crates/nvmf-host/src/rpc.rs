//! SPDK's bdev_nvme methods for NVMe/TCP controllers: bdev_nvme_attach_controller (answers the
//! names of the bdevs the attach reaches), bdev_nvme_detach_controller (a name, or one of its
//! paths), bdev_nvme_get_controllers, bdev_nvme_set_multipath_policy, bdev_nvme_reset_controller.
//! `bdev_nvme_set_options` is an option method (kept by the registry; [`crate::options`] checks
//! it and gives an attach its defaults).

use crate::ctrlr::{AttachOpts, Mode};
use crate::options::{resiliency_ok, Defaults};
use crate::trid::{PathFilter, Trid};
use ferrite_rpc::{errno_error, Registry, RpcError};
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Attach {
    /// Name of the controller (its bdevs are `<name>n<nsid>`).
    #[schemars(example = &"Nvme0")]
    name: String,
    /// Transport type: `tcp`.
    #[schemars(example = &"tcp")]
    trtype: String,
    /// Transport address (an IP address).
    #[schemars(example = &"127.0.0.1")]
    traddr: String,
    /// Address family: `ipv4` or `ipv6`.
    adrfam: Option<String>,
    /// Transport service ID (the TCP port).
    #[serde(default, deserialize_with = "port_text")]
    #[schemars(example = &"4420")]
    trsvcid: Option<String>,
    /// The subsystem's NQN.
    #[schemars(example = &"nqn.2016-06.io.spdk:cnode1")]
    subnqn: Option<String>,
    /// The host NQN to connect as.
    hostnqn: Option<String>,
    /// Local address to connect from (ignored).
    #[allow(dead_code)]
    hostaddr: Option<String>,
    /// Local port to connect from (ignored).
    #[allow(dead_code)]
    hostsvcid: Option<String>,
    /// SPDK's socket priority (kept).
    #[allow(dead_code)]
    priority: Option<String>,
    /// Check reference tags (SPDK's; no protection information here).
    prchk_reftag: Option<bool>,
    /// Check guards (SPDK's; no protection information here).
    prchk_guard: Option<bool>,
    /// Header digests.
    hdgst: Option<bool>,
    /// Data digests.
    ddgst: Option<bool>,
    // SPDK's name (after v26.05) for Connect CATTR bit 2.
    /// Ask the controller to disable SQ flow control.
    disable_sq_flow_control: Option<bool>,
    // SPDK's types (int32, uint32): larger values are refused, not wrapped.
    /// Seconds to keep reconnecting before the controller is given up (-1: for ever).
    ctrlr_loss_timeout_sec: Option<i32>,
    /// Seconds between reconnection attempts.
    reconnect_delay_sec: Option<u32>,
    /// Seconds after which I/O fails while reconnecting.
    fast_io_fail_timeout_sec: Option<u32>,
    /// `disable`, `failover` or `multipath`: what a second path to the same controller name does.
    multipath: Option<String>,
    /// I/O queues to ask for.
    num_io_queues: Option<u32>,
    /// TLS PSK (SPDK's; Ferrite has no TLS).
    psk: Option<String>,
    /// Attach namespaces of unknown command sets (SPDK's).
    #[allow(dead_code)]
    allow_unrecognized_csi: Option<bool>,
    /// SPDK's (kept).
    #[allow(dead_code)]
    drives_per_ctrlr: Option<u32>,
    // Bounds the Connect; Ferrite bounds a controller's whole initialization (Connect
    // included) by its admin timeout instead.
    /// Timeout of the Fabrics Connect (µs).
    #[allow(dead_code)]
    fabrics_connect_timeout_us: Option<u64>,
    /// Most bdevs to make.
    max_bdevs: Option<u32>,
    /// DH-HMAC-CHAP key (SPDK's; Ferrite has no in-band authentication).
    dhchap_key: Option<String>,
    /// DH-HMAC-CHAP controller key (SPDK's; Ferrite has no in-band authentication).
    dhchap_ctrlr_key: Option<String>,
    /// Multipath options.
    multipath_opts: Option<MultipathOpts>,
}

/// `multipath_opts` of an attach (rpc.py groups `--policy`, `--selector`, `--rr-min-io`).
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct MultipathOpts {
    /// `active_passive` or `active_active`.
    policy: Option<String>,
    /// `round_robin` only.
    selector: Option<String>,
    /// I/Os per path before moving on (1 only).
    min_io: Option<u32>,
}

/// An active_active policy (true) or active_passive (false), from SPDK's policy name; only the
/// round_robin selector with one I/O per path is served.
fn policy(policy: &str, selector: Option<&str>, min_io: Option<u32>) -> Result<bool, RpcError> {
    let active_active = match policy {
        "active_passive" => false,
        "active_active" => true,
        _ => return Err(invalid("Invalid parameters: policy must be active_passive or active_active")),
    };
    if selector.is_some_and(|s| s != "round_robin") || min_io.is_some_and(|n| n != 1) {
        return Err(invalid("Invalid parameters: only the round_robin selector with rr_min_io 1 is supported"));
    }
    Ok(active_active)
}

/// An attach parameter asking for what the host lacks, where ignoring it would mislead: -32602
/// naming it.
fn lacks(param: &str, why: &str) -> RpcError {
    invalid(format!("Invalid parameters: {param} is not supported: {why}"))
}

impl Attach {
    /// Refuses what would need TLS, authentication or protection information checks, and
    /// returns the multipath policy asked for (if any).
    fn check(&self) -> Result<Option<bool>, RpcError> {
        if self.psk.is_some() {
            return Err(lacks("psk", "the host has no TLS"));
        }
        if self.dhchap_key.is_some() || self.dhchap_ctrlr_key.is_some() {
            return Err(lacks("dhchap_key", "the host has no DH-HMAC-CHAP authentication"));
        }
        if self.prchk_reftag == Some(true) || self.prchk_guard == Some(true) {
            return Err(lacks("prchk_reftag/prchk_guard", "the host checks no protection information"));
        }
        if self.max_bdevs == Some(0) {
            return Err(errno_error(libc::EINVAL, "max_bdevs cannot be zero"));
        }
        match &self.multipath_opts {
            Some(MultipathOpts { policy: Some(p), selector, min_io }) => {
                policy(p, selector.as_deref(), *min_io).map(Some)
            }
            Some(MultipathOpts { policy: None, selector, min_io }) => {
                policy("active_passive", selector.as_deref(), *min_io).map(|_| None)
            }
            None => Ok(None),
        }
    }
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Detach {
    /// The controller.
    name: String,
    /// Transport type: `tcp`.
    trtype: Option<String>,
    /// Transport address (an IP address).
    traddr: Option<String>,
    /// Address family: `ipv4` or `ipv6`.
    adrfam: Option<String>,
    /// Transport service ID (the TCP port).
    #[serde(default, deserialize_with = "port_text")]
    trsvcid: Option<String>,
    /// The subsystem's NQN.
    subnqn: Option<String>,
    /// Local address to connect from (ignored).
    #[allow(dead_code)]
    hostaddr: Option<String>,
    /// Local port to connect from (ignored).
    #[allow(dead_code)]
    hostsvcid: Option<String>,
}

fn invalid(msg: impl Into<String>) -> RpcError {
    RpcError::invalid_params(msg.into())
}

/// The host NQN used when an attach names none (one per process, as SPDK's default).
fn default_hostnqn() -> String {
    static N: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    N.get_or_init(|| format!("nqn.2014-08.org.nvmexpress:uuid:{}", uuid::Uuid::new_v4())).clone()
}

/// The attach's options; what it leaves out comes from `bdev_nvme_set_options` (`set`: what
/// that has set).
fn attach_opts(a: Attach, set: Option<&Value>) -> Result<AttachOpts, RpcError> {
    let d = Defaults::from_options(set);
    if !a.trtype.eq_ignore_ascii_case("tcp") {
        return Err(invalid(format!("Invalid parameters: trtype {} is not supported (TCP only)", a.trtype)));
    }
    // SPDK's default is multipath.
    let mode = match a.multipath.as_deref() {
        None => Mode::Multipath,
        Some(m) => Mode::parse(m)
            .ok_or_else(|| invalid("Invalid parameters: multipath must be disable, failover or multipath"))?,
    };
    let loss = a.ctrlr_loss_timeout_sec.map_or(d.ctrlr_loss_timeout_sec, i64::from);
    let delay = a.reconnect_delay_sec.map_or(d.reconnect_delay_sec, u64::from);
    let fast_fail = a.fast_io_fail_timeout_sec.map_or(d.fast_io_fail_timeout_sec, u64::from);
    if !resiliency_ok(loss, delay, fast_fail) {
        return Err(invalid(
            "Invalid parameters: ctrlr_loss_timeout_sec, reconnect_delay_sec and fast_io_fail_timeout_sec do not go together",
        ));
    }
    let trid = Trid {
        adrfam: a.adrfam.unwrap_or_else(|| "IPv4".into()),
        traddr: a.traddr,
        trsvcid: a.trsvcid.unwrap_or_else(|| "4420".into()),
        subnqn: a.subnqn.unwrap_or_else(|| ferrite_nvme::spec::nqn::DISCOVERY_NQN.into()),
    };
    trid.socket_addr().map_err(|e| invalid(format!("Invalid parameters: {e}")))?;
    Ok(AttachOpts {
        name: a.name,
        trid,
        hostnqn: a.hostnqn.unwrap_or_else(default_hostnqn),
        hdgst: a.hdgst.unwrap_or(false),
        ddgst: a.ddgst.unwrap_or(false),
        disable_sq_flow_control: a.disable_sq_flow_control.unwrap_or(false),
        ctrlr_loss_timeout_sec: loss,
        reconnect_delay_sec: delay,
        fast_io_fail_timeout_sec: fast_fail,
        io_queue_size: 128,
        kato_ms: d.kato_ms,
        mode,
        io_timeout: d.io_timeout,
        admin_timeout: d.admin_timeout,
        on_timeout: d.action,
    })
}

/// Registers the methods.
pub fn register(reg: &mut Registry) {
    crate::options::register(reg);
    reg.typed("bdev_nvme_attach_controller", "Connects to an NVMe/TCP controller and makes its namespaces bdevs.", |ctx, a: Attach| async move {
        if a.num_io_queues.is_some_and(|n| n == 0 || n > u32::from(u16::MAX) + 1) {
            // As SPDK checks it (the value itself is not used: one I/O queue per reactor).
            return Err(errno_error(libc::EINVAL, "num_io_queues out of bounds, min: 1 max: 65536"));
        }
        if a.name.is_empty() {
            return Err(errno_error(libc::EINVAL, "Invalid argument"));
        }
        let active_active = a.check()?;
        let max_bdevs = a.max_bdevs.unwrap_or(128) as usize;
        let set = ctx.registry.settings().get("bdev_nvme_set_options", None);
        let names = crate::group::attach(attach_opts(a, set.as_ref())?).await?;
        if let Some(aa) = active_active {
            for n in &names {
                crate::group::set_policy(n, aa)?;
            }
        }
        // SPDK answers -ERANGE (the controller stays attached) when the names do not fit.
        if names.len() > max_bdevs {
            return Err(errno_error(
                libc::ERANGE,
                format!("Maximum number of namespaces supported per NVMe controller is {max_bdevs}. Unable to return all names of created bdevs"),
            ));
        }
        Ok(json!(names))
    });
    reg.typed(
        "bdev_nvme_detach_controller",
        "Disconnects an NVMe/TCP controller (or one of its paths).",
        |_, a: Detach| async move {
            if a.trtype.as_deref().is_some_and(|t| !t.eq_ignore_ascii_case("tcp")) {
                return Err(errno_error(
                    libc::EINVAL,
                    format!("Failed to parse trtype: {}", a.trtype.unwrap_or_default()),
                ));
            }
            let f = PathFilter { traddr: a.traddr, trsvcid: a.trsvcid, adrfam: a.adrfam, subnqn: a.subnqn };
            crate::group::detach(&a.name, &f).await?;
            Ok(json!(true))
        },
    );
    /// Params of `bdev_nvme_reset_controller`.
    #[derive(Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct BdevNvmeResetController {
        /// The controller.
        name: String,
        /// Only the path to this controller ID.
        #[serde(default)]
        cntlid: u16,
    }
    reg.typed(
        "bdev_nvme_reset_controller",
        "Resets an NVMe/TCP controller (reconnects its queues).",
        |_, a: BdevNvmeResetController| async move {
            crate::group::reset(&a.name, a.cntlid).await?;
            Ok(json!(true))
        },
    );
    /// Params of `bdev_nvme_get_controllers`.
    #[derive(Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct BdevNvmeGetControllers {
        /// Only this controller.
        name: Option<String>,
    }
    reg.typed(
        "bdev_nvme_get_controllers",
        "The NVMe/TCP controllers, or the one named.",
        |_, a: BdevNvmeGetControllers| async move {
            if let Some(n) = &a.name {
                let g = crate::group::get(n)
                    .ok_or_else(|| errno_error(libc::EINVAL, format!("Controller {n} does not exist")))?;
                return Ok(json!([g.info_json()]));
            }
            Ok(Value::Array(crate::group::all().iter().map(|g| g.info_json()).collect()))
        },
    );
    /// Params of `bdev_nvme_set_multipath_policy`.
    #[derive(Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct BdevNvmeSetMultipathPolicy {
        /// The NVMe bdev.
        name: String,
        /// `active_passive` or `active_active`.
        policy: String,
        /// `round_robin` only.
        selector: Option<String>,
        /// I/Os per path before moving on (1 only).
        rr_min_io: Option<u32>,
    }
    reg.typed(
        "bdev_nvme_set_multipath_policy",
        "Sets how I/O to a multipath NVMe bdev picks its path.",
        |_, a: BdevNvmeSetMultipathPolicy| async move {
            let active_active = policy(&a.policy, a.selector.as_deref(), a.rr_min_io)?;
            crate::group::set_policy(&a.name, active_active)?;
            Ok(json!(true))
        },
    );
}

/// Detaches every controller (daemon shutdown; on the first reactor, after bdevs are gone).
pub async fn shutdown() {
    crate::group::shutdown().await;
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
