//! `iobuf_set_options` sizes the reactors' payload buffer pools, as SPDK's sizes its iobuf pools.
//!
//! SPDK keeps the values and makes its pools when the framework starts (the iobuf subsystem's
//! init, at `framework_start_init` or the end of a startup config); the method is allowed in the
//! startup state only, so after the start it is refused like any startup method (-1, "Method
//! may only be called before framework is initialized ..."). Ferrite does the same: the values
//! given before the start (with `--wait-for-rpc`, or in the startup part of a `--json` config)
//! replace each reactor's pool as the framework starts.
//!
//! SPDK's pools are shared by the whole application; Ferrite's are per reactor, so each reactor
//! gets its share of `small_pool_count` and `large_pool_count` (rounded up), with buffers of
//! `small_bufsize` and `large_bufsize` bytes (rounded up to 4 KiB, Ferrite's alignment).
//! `enable_numa` is kept but changes nothing (the pools are not placed by NUMA node).

use crate::registry::Ctx;
use crate::{errno_error, RpcError};
use ferrite_reactor::buf::{BufPoolConfig, BUF_ALIGN, JUMBO_BUF};
use serde_json::Value;

/// SPDK's minimums (lib/thread/iobuf.c).
const MIN_SMALL_POOL_COUNT: u64 = 64;
const MIN_LARGE_POOL_COUNT: u64 = 8;
const MIN_SMALL_BUFSIZE: u64 = 4096;
const MIN_LARGE_BUFSIZE: u64 = 8192;

/// Checks the members given, as SPDK's `spdk_iobuf_set_opts` does (-EINVAL below its minimums),
/// then against what Ferrite's pools can hold (buffers of at most 2 MiB).
pub(super) fn check(p: &Value) -> Result<(), RpcError> {
    let mins = [
        ("small_pool_count", MIN_SMALL_POOL_COUNT),
        ("large_pool_count", MIN_LARGE_POOL_COUNT),
        ("small_bufsize", MIN_SMALL_BUFSIZE),
        ("large_bufsize", MIN_LARGE_BUFSIZE),
    ];
    for (name, min) in mins {
        if p.get(name).and_then(Value::as_u64).is_some_and(|v| v < min) {
            return Err(errno_error(libc::EINVAL, format!("{name} must be at least {min}")));
        }
    }
    for name in ["small_bufsize", "large_bufsize"] {
        if p.get(name).and_then(Value::as_u64).is_some_and(|v| v > JUMBO_BUF as u64) {
            return Err(errno_error(
                libc::EINVAL,
                format!("{name} must be at most {JUMBO_BUF} in Ferrite (its largest pooled buffer)"),
            ));
        }
    }
    Ok(())
}

/// Each reactor's pool for what `iobuf_set_options` set (`set`, the union of its calls), shared
/// among `reactors` reactors, from `base` (the pools the reactors started with). Fails if the
/// sizes do not fit together or the pools would take more than half of the machine's memory
/// (the small and large classes are registered with io_uring, so they become resident).
pub fn pool_config(set: &Value, reactors: usize, base: BufPoolConfig) -> Result<BufPoolConfig, String> {
    let reactors = reactors.max(1) as u64;
    let share = |name: &str, default: usize| {
        set.get(name).and_then(Value::as_u64).map_or(default, |total| total.div_ceil(reactors) as usize)
    };
    let size = |name: &str, default: usize| {
        set.get(name).and_then(Value::as_u64).map_or(default, |v| (v as usize).next_multiple_of(BUF_ALIGN))
    };
    let cfg = BufPoolConfig {
        small_count: share("small_pool_count", base.small_count),
        large_count: share("large_pool_count", base.large_count),
        small_size: size("small_bufsize", base.small_size),
        large_size: size("large_bufsize", base.large_size),
        ..base
    };
    cfg.check()?;
    let total = cfg.registered_bytes().and_then(|b| b.checked_mul(reactors as usize));
    let limit = physical_memory() / 2;
    match total {
        Some(t) if t <= limit => Ok(cfg),
        _ => Err(format!(
            "iobuf pools of {} MiB in all exceed half of this machine's memory ({} MiB)",
            total.map_or(u64::MAX, |t| t as u64 >> 20),
            limit >> 20
        )),
    }
}

/// Bytes of physical memory (`sysconf`), or 0 if unknown.
fn physical_memory() -> usize {
    // SAFETY: sysconf takes constant names and returns -1 on error.
    let (pages, size) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    if pages <= 0 || size <= 0 {
        return 0;
    }
    (pages as usize).saturating_mul(size as usize)
}

/// Makes every reactor's pool from what `iobuf_set_options` set, if it was called (on the first
/// reactor, as the framework starts). A reactor that cannot make its pool keeps its old one, and
/// the start fails with the reason.
pub async fn apply(ctx: &Ctx) -> Result<(), String> {
    let Some(set) = ctx.registry.settings().get("iobuf_set_options", None) else { return Ok(()) };
    let base = ferrite_reactor::buf_pool().map(|p| p.config()).unwrap_or_default();
    let cfg = pool_config(&set, ctx.engine.count(), base).map_err(|e| format!("iobuf_set_options: {e}"))?;
    if cfg == base {
        return Ok(());
    }
    let results = ctx
        .engine
        .on_all(move |_| ferrite_reactor::resize_buf_pool(cfg).map_err(|e| e.to_string()))
        .await
        .map_err(|_| "a reactor stopped while its buffer pool was being made".to_string())?;
    for (id, r) in results.into_iter().enumerate() {
        r.map_err(|e| format!("iobuf_set_options: reactor {id} cannot make its buffer pool: {e}"))?;
    }
    log::info!(
        "iobuf_set_options: each of {} reactor(s) has {} x {} B small and {} x {} B large buffers",
        ctx.engine.count(),
        cfg.small_count,
        cfg.small_size,
        cfg.large_count,
        cfg.large_size
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn spdk_minimums_answer_einval() {
        for (p, what) in [
            (json!({"small_pool_count": 63}), "small_pool_count"),
            (json!({"large_pool_count": 7}), "large_pool_count"),
            (json!({"small_bufsize": 4095}), "small_bufsize"),
            (json!({"large_bufsize": 8191}), "large_bufsize"),
            (json!({"large_bufsize": JUMBO_BUF + 1}), "large_bufsize"),
        ] {
            let e = check(&p).unwrap_err();
            assert_eq!(e.code, -libc::EINVAL);
            assert!(e.message.contains(what), "{e:?}");
        }
        let spdk_defaults =
            json!({"small_pool_count": 8192, "large_pool_count": 1024, "small_bufsize": 8192, "large_bufsize": 135168});
        assert!(check(&spdk_defaults).is_ok());
        assert!(check(&json!({"enable_numa": true})).is_ok());
    }

    #[test]
    fn counts_are_shared_among_reactors_and_sizes_rounded_to_4_kib() {
        let base = BufPoolConfig::default();
        let set = json!({"small_pool_count": 8193, "large_pool_count": 1024, "small_bufsize": 8000});
        let c = pool_config(&set, 2, base).unwrap();
        assert_eq!((c.small_count, c.large_count, c.small_size, c.large_size), (4097, 512, 8192, base.large_size));
        assert_eq!((c.jumbo_count, c.heap_budget), (base.jumbo_count, base.heap_budget));
        assert_eq!(pool_config(&json!({}), 3, base).unwrap(), base);
        // Sizes that do not fit together, and pools beyond the machine.
        assert!(pool_config(&json!({"small_bufsize": 262144, "large_bufsize": 135168}), 1, base).is_err());
        let huge = json!({"large_pool_count": u64::MAX / 2, "large_bufsize": 135168});
        assert!(pool_config(&huge, 1, base).unwrap_err().contains("half"));
    }
}
