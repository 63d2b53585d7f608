//! JSON-RPC methods of the delay module: bdev_delay_create, bdev_delay_delete,
//! bdev_delay_update_latency (SPDK's names, parameters and results; latencies in µs).

use super::{create, update_latency, Latencies, LatencyType, MODULE};
use crate::passthru::base::{delete, rpc_err, NameParam};
use crate::passthru::deferred;
use ferrite_rpc::Registry;
use serde::Deserialize;
use serde_json::json;

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct DelayCreate {
    /// The base bdev.
    #[schemars(example = &"Malloc0")]
    base_bdev_name: String,
    /// Name of the delay bdev.
    #[schemars(example = &"Delay0")]
    name: String,
    /// Average read latency (µs).
    #[schemars(example = 100)]
    avg_read_latency: u64,
    /// P99 read latency (µs).
    #[schemars(example = 200)]
    p99_read_latency: u64,
    /// Average write latency (µs).
    #[schemars(example = 100)]
    avg_write_latency: u64,
    /// P99 write latency (µs).
    #[schemars(example = 200)]
    p99_write_latency: u64,
    /// The UUID to give (random if not given).
    uuid: Option<String>,
}

#[derive(Deserialize, Clone, Copy, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
enum Latency {
    AvgRead,
    AvgWrite,
    P99Read,
    P99Write,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct UpdateLatency {
    /// The delay bdev.
    delay_bdev_name: String,
    /// Which latency.
    latency_type: Latency,
    /// The latency (µs).
    latency_us: u64,
}

/// Registers the delay module's methods.
pub fn register(reg: &mut Registry) {
    reg.typed(
        "bdev_delay_create",
        "Creates a delay bdev that adds latency to a base bdev's I/O.",
        |_, p: DelayCreate| async move {
            let l = Latencies {
                avg_read: p.avg_read_latency,
                avg_write: p.avg_write_latency,
                p99_read: p.p99_read_latency,
                p99_write: p.p99_write_latency,
            };
            let (base, name, uuid) = (p.base_bdev_name.clone(), p.name.clone(), p.uuid.clone());
            // Over a base that is not there yet, the delay bdev appears when the base does.
            deferred::create_or_defer(MODULE, &p.base_bdev_name, &p.name, move || {
                create(&base, &name, uuid.as_deref(), l)
            })
            .map_err(rpc_err)?;
            Ok(json!(p.name))
        },
    );
    reg.typed("bdev_delay_delete", "Deletes a delay bdev.", |_, p: NameParam| async move {
        if deferred::forget(MODULE, &p.name) {
            return Ok(json!(true));
        }
        delete(&p.name, MODULE).await
    });
    reg.typed("bdev_delay_update_latency", "Changes one latency of a delay bdev.", |_, p: UpdateLatency| async move {
        let t = match p.latency_type {
            Latency::AvgRead => LatencyType::AvgRead,
            Latency::AvgWrite => LatencyType::AvgWrite,
            Latency::P99Read => LatencyType::P99Read,
            Latency::P99Write => LatencyType::P99Write,
        };
        update_latency(&p.delay_bdev_name, t, p.latency_us).map_err(rpc_err)?;
        Ok(json!(true))
    });
}
