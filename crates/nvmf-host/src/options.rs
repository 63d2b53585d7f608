//! The NVMe bdev module's SPDK option methods. `bdev_nvme_set_options` sets, for controllers
//! attached after it (SPDK's `g_opts`), the defaults of an attach's keep-alive and reconnection
//! parameters and the command timeouts (`timeout_us`, `timeout_admin_us`, `action_on_timeout`);
//! a call is checked as SPDK's `spdk_bdev_nvme_set_opts` does. `bdev_nvme_set_hotplug` is held
//! to SPDK's default (no PCIe hotplug here; its poll period is inert). SPDK's schema and
//! defaults of both are `options.schema.json` and `options.defaults.json`; the RPC registry
//! keeps what they set.

use ferrite_rpc::jsonrpc::{INTERNAL_ERROR, INVALID_PARAMS};
use ferrite_rpc::options::{OptionMethod, Spec};
use ferrite_rpc::registry::{RUNTIME, STARTUP};
use ferrite_rpc::{errno_error, Registry, RpcError};
use serde_json::Value;
use std::time::Duration;

/// What a command outstanding past its timeout makes the host do (`action_on_timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeoutAction {
    /// A warning in the log; the command goes on waiting.
    None,
    /// An NVMe Abort of the command (an I/O command's; an admin command resets); if the
    /// controller refuses it or answers that the command was not aborted, a reset.
    Abort,
    /// A controller reset: its queue pairs are dropped and their commands sent again on new ones.
    Reset,
}

/// The defaults `bdev_nvme_set_options` gives an attach.
#[derive(Debug, Clone, Copy)]
pub struct Defaults {
    /// `keep_alive_timeout_ms`.
    pub kato_ms: u32,
    /// `ctrlr_loss_timeout_sec`.
    pub ctrlr_loss_timeout_sec: i64,
    /// `reconnect_delay_sec`.
    pub reconnect_delay_sec: u64,
    /// `fast_io_fail_timeout_sec`.
    pub fast_io_fail_timeout_sec: u64,
    /// `timeout_us` (zero: I/O commands are not timed).
    pub io_timeout: Duration,
    /// `timeout_admin_us`, or `timeout_us` if that is zero.
    pub admin_timeout: Duration,
    /// `action_on_timeout`.
    pub action: TimeoutAction,
}

impl Defaults {
    /// SPDK's defaults.
    pub const SPDK: Defaults = Defaults {
        kato_ms: 10_000,
        ctrlr_loss_timeout_sec: 0,
        reconnect_delay_sec: 0,
        fast_io_fail_timeout_sec: 0,
        io_timeout: Duration::ZERO,
        admin_timeout: Duration::ZERO,
        action: TimeoutAction::None,
    };

    /// The defaults after the calls that left `set` (the merged members of every
    /// `bdev_nvme_set_options` call so far, already decoded by the registry).
    pub fn from_options(set: Option<&Value>) -> Defaults {
        let Some(v) = set else { return Defaults::SPDK };
        let d = Defaults::SPDK;
        let io_us = v["timeout_us"].as_u64().unwrap_or(0);
        let admin_us = v["timeout_admin_us"].as_u64().filter(|&t| t > 0).unwrap_or(io_us);
        Defaults {
            kato_ms: v["keep_alive_timeout_ms"].as_u64().map_or(d.kato_ms, |k| k.min(u64::from(u32::MAX)) as u32),
            ctrlr_loss_timeout_sec: v["ctrlr_loss_timeout_sec"].as_i64().unwrap_or(d.ctrlr_loss_timeout_sec),
            reconnect_delay_sec: v["reconnect_delay_sec"].as_u64().unwrap_or(d.reconnect_delay_sec),
            fast_io_fail_timeout_sec: v["fast_io_fail_timeout_sec"].as_u64().unwrap_or(d.fast_io_fail_timeout_sec),
            io_timeout: Duration::from_micros(io_us),
            // As SPDK: commands are timed only when timeout_us is set.
            admin_timeout: if io_us == 0 { Duration::ZERO } else { Duration::from_micros(admin_us) },
            action: match v["action_on_timeout"].as_str() {
                Some("abort") => TimeoutAction::Abort,
                Some("reset") => TimeoutAction::Reset,
                _ => TimeoutAction::None,
            },
        }
    }
}

/// SPDK's `bdev_nvme_check_io_error_resiliency_params`: the loss timeout is -1 (for ever), 0
/// (never reconnect: no delay, no fast fail) or a time at least the delay, and a fast fail
/// time lies between the delay and the loss timeout.
pub fn resiliency_ok(loss: i64, delay: u64, fast_fail: u64) -> bool {
    match loss {
        l if l < -1 => false,
        -1 => delay != 0 && (fast_fail == 0 || fast_fail >= delay),
        0 => delay == 0 && fast_fail == 0,
        l => {
            let l = l as u64;
            delay != 0 && delay <= l && (fast_fail == 0 || (fast_fail >= delay && fast_fail <= l))
        }
    }
}

/// Checks a `bdev_nvme_set_options` call by what it would leave set, as SPDK does: EINVAL for
/// options that do not go together, EPERM once controllers are attached (they keep the
/// options they were attached with).
fn check(v: &Value) -> Result<(), RpcError> {
    let io_us = v["timeout_us"].as_u64().unwrap_or(0);
    let admin_us = v["timeout_admin_us"].as_u64().unwrap_or(0);
    if io_us == 0 && admin_us != 0 {
        log::warn!("bdev_nvme_set_options: timeout_admin_us needs timeout_us");
        return Err(errno_error(libc::EINVAL, "Invalid argument"));
    }
    if v["bdev_retry_count"].as_i64().is_some_and(|n| n < -1) {
        // SPDK's: -1 retries for ever, 0 and more count; below is refused.
        log::warn!("bdev_nvme_set_options: bdev_retry_count below -1");
        return Err(errno_error(libc::EINVAL, "Invalid argument: bdev_retry_count must be -1 or more"));
    }
    let d = Defaults::from_options(Some(v));
    if !resiliency_ok(d.ctrlr_loss_timeout_sec, d.reconnect_delay_sec, d.fast_io_fail_timeout_sec) {
        log::warn!("bdev_nvme_set_options: ctrlr_loss_timeout_sec, reconnect_delay_sec and fast_io_fail_timeout_sec do not go together");
        return Err(errno_error(libc::EINVAL, "Invalid argument"));
    }
    let kato_us = u64::from(d.kato_ms) * 1000;
    if io_us != 0 && kato_us > io_us || admin_us != 0 && kato_us > admin_us {
        log::warn!("bdev_nvme_set_options: keep_alive_timeout_ms should be less than timeout_us and timeout_admin_us");
    }
    if !crate::group::all().is_empty() {
        return Err(errno_error(libc::EPERM, "RPC not permitted with nvme controllers already attached"));
    }
    Ok(())
}

/// SPDK's schema of the methods.
const SCHEMA: &str = include_str!("options.schema.json");
/// SPDK's defaults of the methods.
const DEFAULTS: &str = include_str!("options.defaults.json");

/// `bdev_nvme_set_options`.
pub static BDEV_NVME_SET_OPTIONS: OptionMethod = OptionMethod {
    honoured: HONOURED,
    inert: &[
        "nvme_adminq_poll_period_us",
        "nvme_ioq_poll_period_us",
        "io_queue_requests",
        "delay_cmd_submit",
        "arbitration_burst",
        "low_priority_weight",
        "medium_priority_weight",
        "high_priority_weight",
        "transport_retry_count",
        "transport_ack_timeout",
        "rdma_srq_size",
        "rdma_max_cq_size",
        "rdma_cm_event_timeout_ms",
        "rdma_umr_per_io",
        "allow_accel_sequence",
        // Narrow what DH-HMAC-CHAP would negotiate; without authentication they change nothing.
        "dhchap_digests",
        "dhchap_dhgroups",
    ],
    guard: Some(check),
    ..OptionMethod::new(
        Spec::new("bdev_nvme_set_options", "bdev", STARTUP | RUNTIME, INTERNAL_ERROR, true),
        SCHEMA,
        DEFAULTS,
    )
};

/// `bdev_nvme_set_hotplug`: PCIe hotplug monitoring, which has no counterpart here (`enable`
/// must stay false).
pub static BDEV_NVME_SET_HOTPLUG: OptionMethod = OptionMethod {
    inert: &["period_us"],
    ..OptionMethod::new(Spec::new("bdev_nvme_set_hotplug", "bdev", RUNTIME, INVALID_PARAMS, false), SCHEMA, DEFAULTS)
};

/// Registers the option methods.
pub fn register(reg: &mut Registry) {
    reg.option_method(&BDEV_NVME_SET_OPTIONS);
    reg.option_method(&BDEV_NVME_SET_HOTPLUG);
}

/// The members of `bdev_nvme_set_options` the host acts on (`Defaults::from_options`, and the
/// retry count of `attach_opts`); the others keep SPDK's default or are inert.
pub const HONOURED: &[&str] = &[
    "action_on_timeout",
    "timeout_us",
    "timeout_admin_us",
    "keep_alive_timeout_ms",
    "ctrlr_loss_timeout_sec",
    "reconnect_delay_sec",
    "fast_io_fail_timeout_sec",
    "bdev_retry_count",
];

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn resiliency_follows_spdk() {
        assert!(resiliency_ok(0, 0, 0));
        assert!(!resiliency_ok(0, 1, 0));
        assert!(!resiliency_ok(0, 0, 1));
        assert!(resiliency_ok(-1, 1, 0));
        assert!(!resiliency_ok(-1, 0, 0));
        assert!(!resiliency_ok(-1, 5, 2));
        assert!(resiliency_ok(10, 2, 5));
        assert!(!resiliency_ok(10, 20, 0));
        assert!(!resiliency_ok(10, 2, 11));
        assert!(!resiliency_ok(-2, 1, 0));
    }

    #[test]
    fn spdks_schema_and_defaults_cover_the_honoured_members() {
        BDEV_NVME_SET_OPTIONS.validate().unwrap();
        BDEV_NVME_SET_HOTPLUG.validate().unwrap();
    }

    #[test]
    fn honoured_and_inert_members_take_any_value_others_only_spdks_default() {
        let call = |p: Value| BDEV_NVME_SET_OPTIONS.check_call(Some(p));
        assert!(call(json!({"timeout_us": 5, "action_on_timeout": "abort"})).is_ok(), "honoured");
        assert!(call(json!({"io_queue_requests": 4096})).is_ok(), "inert");
        assert!(call(json!({"generate_uuids": false})).is_ok(), "SPDK's default");
        let e = call(json!({"generate_uuids": true})).unwrap_err();
        assert!(e.code == -32602 && e.message.contains("generate_uuids"), "{e:?}");
        // SPDK's decoder and its error code (-32603 for this method).
        assert_eq!(call(json!({"transport_ack_timeout": 256})).unwrap_err().code, -32603);
        assert_eq!(call(json!({"action_on_timeout": "explode"})).unwrap_err().code, -32603);
        assert_eq!(call(json!({"dhchap_digests": ["sha256", "md5"]})).unwrap_err().code, -32603);
        assert!(call(json!({"multipath_opts": {"policy": "active_active"}}))
            .unwrap_err()
            .message
            .contains("multipath_opts"));
        let hotplug = |p: Value| BDEV_NVME_SET_HOTPLUG.check_call(Some(p));
        assert!(hotplug(json!({"enable": false, "period_us": 5})).is_ok());
        assert!(hotplug(json!({"enable": true})).unwrap_err().message.contains("enable"));
        assert_eq!(hotplug(json!({"period_us": 5})).unwrap_err().code, -32602, "enable is required");
    }

    #[test]
    fn admin_timeout_follows_the_io_timeout() {
        let d = Defaults::from_options(Some(&json!({"timeout_us": 2_000_000, "action_on_timeout": "abort"})));
        assert_eq!((d.io_timeout, d.admin_timeout), (Duration::from_secs(2), Duration::from_secs(2)));
        assert_eq!(d.action, TimeoutAction::Abort);
        let d = Defaults::from_options(Some(&json!({"timeout_us": 2_000_000, "timeout_admin_us": 5_000_000})));
        assert_eq!(d.admin_timeout, Duration::from_secs(5));
        assert_eq!(d.action, TimeoutAction::None);
        assert!(check(&json!({"timeout_admin_us": 5})).is_err());
        assert!(check(&json!({"ctrlr_loss_timeout_sec": 5})).is_err());
        assert_eq!(Defaults::from_options(None).kato_ms, 10_000);
    }
}
