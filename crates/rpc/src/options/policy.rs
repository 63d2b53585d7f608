//! What an option call may set here. SPDK's saved configs list every option with its value, and
//! they must keep loading unchanged; but an option that would change behaviour Ferrite does not
//! have must not be taken silently, or its caller believes in a feature that is not there. So
//! each member of an option method is one of:
//! - *honoured*: a crate of Ferrite acts on it, and says so when it registers
//!   ([`super::Settings::honour`]): any valid value;
//! - *inert*: it tunes SPDK machinery that has no counterpart here and whose value changes
//!   nothing anyone can observe (pool and cache sizes, poll periods, RDMA-only and PCIe-only
//!   knobs): any valid value, kept for `save_config`;
//! - anything else: only SPDK v26.05's default value (`spdk_defaults.json`, taken from
//!   `spdk_tgt`'s own `save_config`) is accepted; another value is refused with an error that
//!   names the member.

use super::Spec;
use crate::jsonrpc::{RpcError, INVALID_PARAMS};
use serde_json::Value;
use std::sync::OnceLock;

/// Members of each method that are inert (see the module doc); `*` for every member.
const INERT: &[(&str, &[&str])] = &[
    ("framework_set_scheduler", &["period"]),
    ("sock_set_default_impl", &["impl_name"]),
    ("sock_impl_set_options", &["*"]),
    ("accel_set_options", &["*"]),
    ("fsdev_set_opts", &["*"]),
    (
        "bdev_set_options",
        &["bdev_io_pool_size", "bdev_io_cache_size", "iobuf_small_cache_size", "iobuf_large_cache_size"],
    ),
    (
        "bdev_nvme_set_options",
        &[
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
    ),
    ("bdev_nvme_set_hotplug", &["period_us"]),
    ("nvmf_set_config", &["poll_groups_mask", "dhchap_digests", "dhchap_dhgroups"]),
    (
        "iscsi_set_options",
        &[
            "pdu_pool_size",
            "immediate_data_pool_size",
            "data_out_pool_size",
            "max_large_datain_per_connection",
            "max_r2t_per_connection",
        ],
    ),
];

fn defaults() -> &'static Value {
    static D: OnceLock<Value> = OnceLock::new();
    D.get_or_init(|| {
        let v: Value = serde_json::from_str(include_str!("spdk_defaults.json")).expect("spdk_defaults.json is JSON");
        v["defaults"].clone()
    })
}

/// SPDK's default of member `field` of `method` (for instance `key` where the method has one).
pub fn default_of(method: &str, key: Option<&str>, field: &str) -> Option<&'static Value> {
    let m = &defaults()[method];
    let d = match key {
        Some(k) => &m[k][field],
        None => &m[field],
    };
    (!d.is_null()).then_some(d)
}

/// True if `v` is the default `d`: an object is when each member it gives is (SPDK decodes a
/// partial object over the defaults).
fn same_as_default(v: &Value, d: &Value) -> bool {
    match (v, d) {
        (Value::Object(vm), Value::Object(dm)) => {
            vm.iter().all(|(k, vv)| dm.get(k).is_some_and(|dv| same_as_default(vv, dv)))
        }
        _ => v == d,
    }
}

fn inert(method: &str, field: &str) -> bool {
    INERT.iter().any(|(m, fields)| *m == method && fields.iter().any(|f| *f == "*" || *f == field))
}

/// Checks each member of a call of `spec`'s method: honoured (`honoured`), inert, the instance
/// key, or SPDK's default; the first other one is refused, by name.
pub fn check(spec: &Spec, params: &Value, honoured: &[&str]) -> Result<(), RpcError> {
    let Some(obj) = params.as_object() else { return Ok(()) };
    let key = spec.key.and_then(|k| params[k].as_str());
    for (field, v) in obj {
        if Some(field.as_str()) == spec.key || honoured.contains(&field.as_str()) || inert(spec.method, field) {
            continue;
        }
        match default_of(spec.method, key, field) {
            Some(d) if same_as_default(v, d) => {}
            Some(d) => {
                return Err(RpcError::new(
                    INVALID_PARAMS,
                    format!(
                        "{}: {field} = {v} would change behaviour Ferrite does not have; only SPDK's default ({d}) is accepted",
                        spec.method
                    ),
                ))
            }
            None => {
                return Err(RpcError::new(
                    INVALID_PARAMS,
                    format!("{}: {field} is not supported by Ferrite (it has no such behaviour)", spec.method),
                ))
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::SPECS;
    use serde_json::json;

    fn spec(m: &str) -> &'static Spec {
        SPECS.iter().find(|s| s.method == m).unwrap()
    }

    #[test]
    fn spdks_defaults_pass_and_other_values_are_refused_by_name() {
        let raid = spec("bdev_raid_set_options");
        assert!(check(raid, &json!({"process_window_size_kb": 1024, "process_max_bandwidth_mb_sec": 0}), &[]).is_ok());
        let e = check(raid, &json!({"process_window_size_kb": 2048}), &[]).unwrap_err();
        assert_eq!(e.code, INVALID_PARAMS);
        assert!(e.message.contains("process_window_size_kb"), "{}", e.message);
        let iscsi = spec("bdev_iscsi_set_options");
        assert!(check(iscsi, &json!({"timeout_sec": 30}), &[]).is_ok());
        assert!(check(iscsi, &json!({"timeout_sec": 5}), &[]).unwrap_err().message.contains("timeout_sec"));
    }

    #[test]
    fn inert_and_honoured_members_take_any_value() {
        let sock = spec("sock_impl_set_options");
        assert!(check(sock, &json!({"impl_name": "posix", "recv_buf_size": 65536}), &[]).is_ok());
        let nvme = spec("bdev_nvme_set_options");
        assert!(check(nvme, &json!({"io_queue_requests": 4096}), &[]).is_ok(), "inert");
        assert!(check(nvme, &json!({"timeout_us": 5}), &[]).is_err(), "not honoured unless the host says so");
        assert!(check(nvme, &json!({"timeout_us": 5}), &["timeout_us"]).is_ok());
        assert!(check(nvme, &json!({"generate_uuids": true}), &[]).unwrap_err().message.contains("generate_uuids"));
        let nvmf = spec("nvmf_set_config");
        assert!(
            check(nvmf, &json!({"admin_cmd_passthru": {"identify_ctrlr": false}}), &[]).is_ok(),
            "a partial default"
        );
        assert!(check(nvmf, &json!({"admin_cmd_passthru": {"identify_ctrlr": true}}), &[]).is_err());
    }

    #[test]
    fn every_member_of_spdks_saved_defaults_is_accepted() {
        for s in SPECS {
            let d = &defaults()[s.method];
            let calls: Vec<Value> = match s.key {
                Some(_) => d.as_object().map(|m| m.values().cloned().collect()).unwrap_or_default(),
                None if d.is_object() => vec![d.clone()],
                None => vec![],
            };
            for call in calls {
                check(s, &call, &[]).unwrap_or_else(|e| panic!("{}: {}", s.method, e.message));
            }
        }
    }
}
