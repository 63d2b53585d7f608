//! The bdev subsystem's JSON-RPC methods, with SPDK's names, parameters and result shapes:
//! bdev_get_bdevs, bdev_get_iostat, bdev_reset_iostat, and create/delete for the null, malloc and
//! uring modules (QoS and histogram methods are in `qos` and `histogram`).

use crate::bdev::list;
use crate::bdev::{lookup, unregister, Bdev, BdevError};
use crate::channel::{local_iostat, local_iostat_if_used, prune_local_iostat, reset_local_iostat};
use crate::module::wait_for_examine;
use crate::stats::{IoStat, ResetMode, ERROR_KINDS};
use crate::IoType;
use ferrite_rpc::{errno_error, Ctx, Registry, RpcError, RpcResult, Subsystem};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

/// The JSON-RPC error for a bdev error (SPDK's errno, as a module's method answers it).
pub fn bdev_err(e: BdevError) -> RpcError {
    errno_error(e.errno(), e.to_string())
}

pub(crate) fn not_found(name: &str) -> RpcError {
    errno_error(libc::ENODEV, format!("No such device: bdev {name} not found"))
}

/// SPDK's keys of `supported_io_types`, with the I/O type each stands for (None: a type Ferrite
/// has no request for, always false; "zcopy" is answered by the module).
const IO_TYPE_KEYS: [(&str, Option<IoType>); 20] = [
    ("read", Some(IoType::Read)),
    ("write", Some(IoType::Write)),
    ("unmap", Some(IoType::Unmap)),
    ("flush", Some(IoType::Flush)),
    ("reset", Some(IoType::Reset)),
    ("compare", Some(IoType::Compare)),
    ("compare_and_write", Some(IoType::CompareAndWrite)),
    ("abort", Some(IoType::Abort)),
    ("seek_hole", Some(IoType::SeekHole)),
    ("seek_data", Some(IoType::SeekData)),
    ("copy", Some(IoType::Copy)),
    ("nvme_admin", Some(IoType::NvmeAdmin)),
    ("nvme_io", Some(IoType::NvmeIo)),
    ("nvme_io_md", None),
    ("write_zeroes", Some(IoType::WriteZeroes)),
    ("zcopy", None),
    ("get_zone_info", None),
    ("zone_management", None),
    ("zone_append", None),
    ("nvme_iov_md", None),
];

/// The `bdev_get_bdevs` object of one bdev.
pub fn bdev_json(b: &Bdev) -> Value {
    let io_types: serde_json::Map<String, Value> = IO_TYPE_KEYS
        .iter()
        .map(|(k, t)| {
            let on = match t {
                Some(t) => b.supports(*t),
                None => *k == "zcopy" && b.backend().zcopy(),
            };
            (k.to_string(), json!(on))
        })
        .collect();
    // SPDK lists the UUID among the aliases (it registers it as one).
    let mut aliases = vec![b.uuid().to_string()];
    aliases.extend(b.aliases().iter().cloned());
    let mut v = json!({
        "name": b.name(),
        "aliases": aliases,
        "product_name": b.product_name(),
        "block_size": b.block_size(),
        "num_blocks": b.num_blocks(),
        "uuid": b.uuid().to_string(),
        "assigned_rate_limits": crate::qos::limits_json(b),
        "claimed": b.claimed_by().is_some(),
        "zoned": false,
        "supported_io_types": io_types,
        "driver_specific": b.backend().driver_specific(),
    });
    if let Some(t) = b.claim_type() {
        v["claim_type"] = json!(t.name());
    }
    let l = b.limits();
    // SPDK v26.05's rpc_dump_bdev_info writes these for every bdev (0: no preference).
    v["preferred_unmap_granularity"] = json!(l.unmap_granularity);
    v["preferred_unmap_alignment"] = json!(l.unmap_alignment);
    if l.optimal_io_boundary > 0 {
        v["optimal_io_boundary"] = json!(l.optimal_io_boundary);
    }
    if b.physical_block_size() != b.block_size() {
        v["physical_block_size"] = json!(b.physical_block_size());
    }
    v
}

fn iostat_json(b: &Bdev, s: &IoStat) -> Value {
    let mut v = stat_fields(s);
    v["name"] = json!(b.name());
    v
}

/// SPDK's `spdk_bdev_dump_io_stat_json` fields (and Ferrite's write-zeroes, flush and reset
/// counts).
fn stat_fields(s: &IoStat) -> Value {
    let min = |i: usize| if s.min_latency_ticks[i] == u64::MAX { 0 } else { s.min_latency_ticks[i] };
    let errors: serde_json::Map<String, Value> = ERROR_KINDS
        .iter()
        .zip(s.errors.iter())
        .filter(|(_, n)| **n > 0)
        .map(|(k, n)| (k.to_string(), json!(n)))
        .collect();
    json!({
        "bytes_read": s.bytes_read, "num_read_ops": s.num_read_ops,
        "bytes_written": s.bytes_written, "num_write_ops": s.num_write_ops,
        "bytes_unmapped": s.bytes_unmapped, "num_unmap_ops": s.num_unmap_ops,
        "bytes_copied": s.bytes_copied, "num_copy_ops": s.num_copy_ops,
        "read_latency_ticks": s.read_latency_ticks,
        "max_read_latency_ticks": s.max_read_latency_ticks, "min_read_latency_ticks": min(0),
        "write_latency_ticks": s.write_latency_ticks,
        "max_write_latency_ticks": s.max_write_latency_ticks, "min_write_latency_ticks": min(1),
        "unmap_latency_ticks": s.unmap_latency_ticks,
        "max_unmap_latency_ticks": s.max_unmap_latency_ticks, "min_unmap_latency_ticks": min(2),
        "copy_latency_ticks": s.copy_latency_ticks,
        "max_copy_latency_ticks": s.max_copy_latency_ticks, "min_copy_latency_ticks": min(3),
        "num_write_zeroes_ops": s.num_write_zeroes_ops, "bytes_write_zeroes": s.bytes_write_zeroes,
        "num_flush_ops": s.num_flush_ops, "num_reset_ops": s.num_reset_ops,
        "io_error": errors,
    })
}

/// Sums every core's statistics of `bdevs` (each core answers by message).
pub async fn iostat(ctx: &Ctx, bdevs: &[Bdev]) -> Vec<IoStat> {
    iostat_and_reset(ctx, bdevs, ResetMode::None).await
}

/// As [`iostat`], and each core resets its counters as `mode` says right after reading them
/// (SPDK's `reset_mode` of `bdev_get_iostat`).
pub async fn iostat_and_reset(ctx: &Ctx, bdevs: &[Bdev], mode: ResetMode) -> Vec<IoStat> {
    let ids: Arc<Vec<u64>> = Arc::new(bdevs.iter().map(|b| b.id()).collect());
    let per_core = ctx
        .engine
        .on_all(move |_| {
            prune_local_iostat();
            ids.iter()
                .map(|id| {
                    let s = local_iostat(*id);
                    reset_local_iostat(*id, mode);
                    s
                })
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
    let mut total = vec![IoStat::default(); bdevs.len()];
    for core in per_core {
        for (t, s) in total.iter_mut().zip(core.iter()) {
            t.add(s);
        }
    }
    total
}

/// Params that name one bdev (a module's delete method, `bdev_examine`).
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NameParam {
    /// The bdev's name.
    pub name: String,
}

/// `bdev_reset_iostat` params.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct ResetParams {
    /// The bdev (all if not given).
    name: Option<String>,
    /// `all`, `maxmin` or `none`.
    mode: Option<String>,
}

fn reset_mode(name: Option<&str>, default: ResetMode) -> Result<ResetMode, RpcError> {
    match name {
        None => Ok(default),
        Some(n) => ResetMode::from_name(n).ok_or_else(|| {
            errno_error(libc::EINVAL, format!("reset mode {n:?} must be one of all, maxmin, error, none"))
        }),
    }
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct OptionalName {
    /// The bdev (all if not given).
    name: Option<String>,
    /// Milliseconds to wait for the named bdev to appear.
    timeout: Option<u64>,
}

/// `bdev_get_iostat` params: SPDK 24.01's `name`, and the `names` list and `reset_mode` of later
/// releases.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct IostatParams {
    /// The bdev (all if not given).
    name: Option<String>,
    /// The bdevs (all if not given).
    names: Option<Vec<String>>,
    /// Statistics per channel (reactor) too.
    per_channel: Option<bool>,
    /// Reset after reading: `all`, `maxmin` or `none`.
    reset_mode: Option<String>,
}

fn selected(name: Option<String>) -> Result<Vec<Bdev>, RpcError> {
    match name {
        Some(n) => lookup(&n).map(|b| vec![b]).ok_or_else(|| not_found(&n)),
        None => Ok(list()),
    }
}

/// A module's delete method: unregisters the bdev (if it is the module's) and answers once
/// every opener has closed it.
pub async fn delete(p: NameParam, module: &'static str) -> RpcResult {
    let name = p.name;
    let done = unregister(&name, Some(module)).map_err(|e| match e {
        BdevError::NotFound(_) => errno_error(libc::ENODEV, format!("No such device: {e}")),
        e => bdev_err(e),
    })?;
    done.await.map_err(|e| RpcError::internal(e.to_string()))?;
    log::info!("deleted {module} bdev {}", name.escape_debug());
    Ok(json!(true))
}

/// SPDK's hints that Ferrite cannot honour: accepted at their default (so that configs SPDK
/// writes load), refused with a clear message otherwise.
pub fn check_default<T: PartialEq + std::fmt::Display>(name: &str, v: Option<T>, default: T) -> Result<(), RpcError> {
    match v {
        Some(v) if v != default => Err(RpcError::new(
            ferrite_rpc::jsonrpc::INVALID_PARAMS,
            format!("Invalid parameters: {name} = {v} is not supported (only {default})"),
        )),
        _ => Ok(()),
    }
}

/// Ferrite supports no separate metadata or protection information: SPDK's parameters for them
/// are accepted when they ask for none, else refused as invalid parameters naming the one that
/// asks (the blocks' layout would differ). The other DIF options only qualify these two.
pub fn check_no_metadata(md_size: Option<u32>, dif_type: Option<u32>) -> Result<(), RpcError> {
    for (name, v) in [("md_size", md_size), ("dif_type", dif_type)] {
        if v.unwrap_or(0) != 0 {
            return Err(RpcError::new(
                ferrite_rpc::jsonrpc::INVALID_PARAMS,
                format!(
                    "Invalid parameters: {name} is not supported: Ferrite's bdevs carry no metadata or DIF (0 only)"
                ),
            ));
        }
    }
    Ok(())
}

/// Registers the bdev methods and the "bdev" subsystem (its saved config lists a create call per
/// bdev, followed by bdev_wait_for_examine as SPDK writes it).
pub fn register(reg: &mut Registry) {
    reg.option_method(&crate::options::BDEV_SET_OPTIONS);
    reg.typed(
        "bdev_get_bdevs",
        "Every bdev, or the one named (waiting up to `timeout` ms for it to appear).",
        |_, p: OptionalName| async move {
            // As in SPDK, `timeout` (ms) waits for a named bdev to appear.
            if let (Some(name), Some(ms)) = (&p.name, p.timeout) {
                let deadline = std::time::Instant::now() + std::time::Duration::from_millis(ms.min(3_600_000));
                while lookup(name).is_none() && std::time::Instant::now() < deadline {
                    ferrite_reactor::sleep(std::time::Duration::from_millis(10)).await;
                }
                if lookup(name).is_none() {
                    // As SPDK: the wait ran out.
                    return Err(errno_error(libc::ETIMEDOUT, format!("bdev {name} did not appear within {ms} ms")));
                }
            }
            Ok(Value::Array(selected(p.name)?.iter().map(bdev_json).collect()))
        },
    );
    reg.typed(
        "bdev_get_iostat",
        "I/O statistics of every bdev or of those named, optionally per channel.",
        |ctx, p: IostatParams| async move {
            let mode = reset_mode(p.reset_mode.as_deref(), ResetMode::None)?;
            let bdevs: Vec<Bdev> = match p.names {
                Some(names) => names.iter().map(|n| lookup(n).ok_or_else(|| not_found(n))).collect::<Result<_, _>>()?,
                None => selected(p.name)?,
            };
            if p.per_channel == Some(true) {
                // As SPDK: one bdev, one entry per core that has used it, with the core's thread id
                // (the reactor index, as `framework_get_reactors` names its threads).
                let [b] = &bdevs[..] else {
                    return Err(errno_error(libc::EINVAL, "Can't use per_channel with multiple bdevs"));
                };
                let id = b.id();
                let per_core = ctx
                    .engine
                    .on_all(move |core| {
                        let s = local_iostat_if_used(id);
                        reset_local_iostat(id, mode);
                        s.map(|s| (core, s))
                    })
                    .await
                    .unwrap_or_default();
                let channels: Vec<Value> = per_core
                    .into_iter()
                    .flatten()
                    .map(|(core, s)| {
                        let mut v = stat_fields(&s);
                        v["thread_id"] = json!(core);
                        v
                    })
                    .collect();
                return Ok(json!({"tick_rate": ferrite_reactor::tsc::ticks_per_sec(),
                "ticks": ferrite_reactor::tsc::ticks(), "name": b.name(), "channels": channels}));
            }
            let stats = iostat_and_reset(&ctx, &bdevs, mode).await;
            // Ferrite's addition (as SPDK's with queue-depth sampling on): the I/O outstanding on
            // each bdev now, summed over the reactors.
            let ids: Arc<Vec<u64>> = Arc::new(bdevs.iter().map(|b| b.id()).collect());
            let per_core = ctx
                .engine
                .on_all(move |_| ids.iter().map(|id| crate::channel::local_queue_depth(*id)).collect::<Vec<u64>>())
                .await
                .unwrap_or_default();
            let list: Vec<Value> = bdevs
                .iter()
                .zip(stats.iter())
                .enumerate()
                .map(|(i, (b, s))| {
                    let mut v = iostat_json(b, s);
                    v["queue_depth"] = json!(per_core.iter().map(|c| c.get(i).copied().unwrap_or(0)).sum::<u64>());
                    v
                })
                .collect();
            Ok(json!({"tick_rate": ferrite_reactor::tsc::ticks_per_sec(),
            "ticks": ferrite_reactor::tsc::ticks(), "bdevs": list}))
        },
    );
    reg.typed(
        "bdev_reset_iostat",
        "Resets the I/O statistics of one bdev or of all.",
        |ctx, p: ResetParams| async move {
            let mode = reset_mode(p.mode.as_deref(), ResetMode::All)?;
            let ids: Arc<Vec<u64>> = Arc::new(selected(p.name)?.iter().map(|b| b.id()).collect());
            if mode != ResetMode::None {
                let _ = ctx.engine.on_all(move |_| ids.iter().for_each(|id| reset_local_iostat(*id, mode))).await;
            }
            Ok(json!(true))
        },
    );
    crate::qos::register(reg);
    crate::histogram::register(reg);
    for m in crate::module::modules() {
        m.register_rpcs(reg);
    }
    reg.bare(
        "bdev_wait_for_examine",
        "Answers once every module has examined every bdev registered so far.",
        |_| async move {
            wait_for_examine().await.map_err(|e| RpcError::internal(e.to_string()))?;
            Ok(json!(true))
        },
    );
    reg.typed("bdev_examine", "Examines a bdev (when automatic examine is off).", |_, p: NameParam| async move {
        if crate::module::auto_examine() {
            return Err(errno_error(libc::EINVAL, "Manual examine is not allowed if auto examine is enabled"));
        }
        let b = lookup(&p.name).ok_or_else(|| not_found(&p.name))?;
        crate::module::offer(&b);
        wait_for_examine().await.map_err(|e| RpcError::internal(e.to_string()))?;
        Ok(json!(true))
    });
    reg.subsystem(Subsystem {
        name: "bdev",
        depends_on: vec![],
        config: Arc::new(|| {
            // As SPDK: each bdev's create call, then its QoS limits and histogram setting.
            // A bdev made by another for its own use is made again by its owner's entry.
            let mut entries: Vec<Value> = list()
                .iter()
                .filter(|b| b.made_for().is_none())
                .flat_map(|b| {
                    b.backend().config_entry(b).map(|create| {
                        // An array stands for several create calls (a module that makes
                        // several bdevs with one call writes them all with its first bdev).
                        let mut v = match create {
                            Value::Array(a) => a,
                            one => vec![one],
                        };
                        v.extend(crate::qos::config_entry(b));
                        v.extend(crate::histogram::config_entry(b));
                        v
                    })
                })
                .flatten()
                .collect();
            entries.push(json!({"method": "bdev_wait_for_examine"}));
            entries
        }),
    });
}
