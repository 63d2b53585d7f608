//! What `bdev_nvme_set_options` sets for controllers attached after it (SPDK's `g_opts`): the
//! defaults of an attach's keep-alive and reconnection parameters, and the command timeouts
//! (`timeout_us`, `timeout_admin_us`, `action_on_timeout`). The option method itself is kept by
//! the RPC registry; this module checks a call as SPDK's `spdk_bdev_nvme_set_opts` does.

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

/// Adds the check of `bdev_nvme_set_options` to the registry.
pub fn register(reg: &mut Registry) {
    reg.settings().guard("bdev_nvme_set_options", Box::new(check));
    reg.settings().honour("bdev_nvme_set_options", HONOURED);
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
