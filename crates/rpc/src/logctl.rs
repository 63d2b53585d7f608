//! SPDK's log methods over the `log` crate: log_set_level/log_get_level,
//! log_set_print_level/log_get_print_level, log_set_flag/log_clear_flag/log_get_flags,
//! log_enable_timestamps.
//!
//! As in SPDK, a record goes nowhere unless its level is within the log level or the print level
//! (that gate is the `log` crate's max level), and is printed to stderr if it is within the print
//! level. Ferrite has no syslog, so in effect the print level decides what appears; the log level
//! only widens the gate. Debug records are printed only for components whose flag is set
//! (SPDK's SPDK_DEBUGLOG); a component is a Ferrite crate (`bdev` for ferrite_bdev, ...).

use crate::jsonrpc::{RpcError, INTERNAL_ERROR, INVALID_PARAMS};
use crate::registry::{Params, Registry, RUNTIME, STARTUP};
use log::{Level, LevelFilter};
use serde_json::{json, Map, Value};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU8, Ordering};

/// SPDK's level names, in order (index = SPDK_LOG_ERROR .. SPDK_LOG_DEBUG).
pub const LEVELS: [&str; 5] = ["ERROR", "WARNING", "NOTICE", "INFO", "DEBUG"];
/// Log flags: Ferrite's components (a crate `ferrite_X` is component `X`; the daemon's own
/// crate is `app`).
pub const FLAGS: [&str; 23] = [
    "app",
    "bdev",
    "fuse",
    "nbd",
    "perf",
    "reactor",
    "rpc",
    "blob",
    "iscsi",
    "iscsi_host",
    "iscsi_target",
    "lvol",
    "modules",
    "nexus",
    "nvme",
    "nvmf",
    "nvmf_host",
    "raid",
    "scsi",
    "target",
    "vhost",
    "virtio_user",
    "alloc_count",
];

static LOG_LEVEL: AtomicU8 = AtomicU8::new(2);
static PRINT_LEVEL: AtomicU8 = AtomicU8::new(2);
static FLAG_BITS: AtomicU32 = AtomicU32::new(0);
static TIMESTAMPS: AtomicBool = AtomicBool::new(true);

/// Whether log lines carry their time (`log_enable_timestamps`; on by default, as in SPDK).
pub fn timestamps() -> bool {
    TIMESTAMPS.load(Ordering::Relaxed)
}

/// The component of a record's target: the flag name of a Ferrite crate, else the target's
/// first path segment (`io_uring`).
pub fn component(target: &str) -> &str {
    match flag_of(target) {
        Some(i) => FLAGS[i],
        None => target.split("::").next().unwrap_or(target),
    }
}

/// SPDK's level of a `log` record: info lines are SPDK's notices (what is printed by default).
fn spdk_level(l: Level) -> u8 {
    match l {
        Level::Error => 0,
        Level::Warn => 1,
        Level::Info => 2,
        Level::Debug | Level::Trace => 4,
    }
}

/// The component flag index of a record's target (`ferrite_bdev::...` → `bdev`).
fn flag_of(target: &str) -> Option<usize> {
    let krate = target.split("::").next().unwrap_or(target);
    let name = krate.strip_prefix("ferrite_").unwrap_or(if krate == "ferrite" { "app" } else { krate });
    FLAGS.iter().position(|f| *f == name)
}

/// Whether a record of `level` from `target` is printed.
pub fn printed(level: Level, target: &str) -> bool {
    let l = spdk_level(level);
    if l > PRINT_LEVEL.load(Ordering::Relaxed) {
        return false;
    }
    if l == 4 {
        return flag_of(target).is_some_and(|i| FLAG_BITS.load(Ordering::Relaxed) & (1 << i) != 0);
    }
    true
}

fn update_gate() {
    let gate = LOG_LEVEL.load(Ordering::Relaxed).max(PRINT_LEVEL.load(Ordering::Relaxed));
    log::set_max_level(match gate {
        0 => LevelFilter::Error,
        1 => LevelFilter::Warn,
        2 | 3 => LevelFilter::Info,
        _ => LevelFilter::Trace,
    });
}

/// Sets both levels from a `log` filter name (`--log-level`): debug and trace also set every
/// flag (like SPDK's `-L all`).
pub fn init_from_filter(filter: LevelFilter) {
    let l = match filter {
        LevelFilter::Off | LevelFilter::Error => 0,
        LevelFilter::Warn => 1,
        LevelFilter::Info => 3,
        LevelFilter::Debug | LevelFilter::Trace => 4,
    };
    LOG_LEVEL.store(l, Ordering::Relaxed);
    PRINT_LEVEL.store(l, Ordering::Relaxed);
    if l == 4 {
        FLAG_BITS.store((1 << FLAGS.len()) - 1, Ordering::Relaxed);
    }
    update_gate();
}

/// Parses a level name as SPDK's decoder does (case-insensitive; WARN for WARNING too).
fn parse_level(p: Params) -> Result<u8, RpcError> {
    let fail = || RpcError::new(INTERNAL_ERROR, "spdk_json_decode_object failed");
    let Some(Value::Object(o)) = p.0 else { return Err(fail()) };
    if o.len() != 1 {
        return Err(fail());
    }
    let name = o.get("level").and_then(Value::as_str).ok_or_else(fail)?.to_ascii_uppercase();
    let name = if name == "WARN" { "WARNING".to_string() } else { name };
    LEVELS.iter().position(|l| *l == name).map(|i| i as u8).ok_or_else(fail)
}

fn parse_flag(p: Params) -> Result<usize, RpcError> {
    let fail = || RpcError::new(INTERNAL_ERROR, "spdk_json_decode_object failed");
    let Some(Value::Object(o)) = p.0 else { return Err(fail()) };
    if o.len() != 1 {
        return Err(fail());
    }
    let name = o.get("flag").and_then(Value::as_str).ok_or_else(fail)?;
    if name == "all" {
        return Ok(usize::MAX);
    }
    FLAGS.iter().position(|f| *f == name).ok_or_else(|| RpcError::new(INVALID_PARAMS, "invalid log flag"))
}

fn no_params(p: Params, method: &str) -> Result<(), RpcError> {
    match p.0 {
        None => Ok(()),
        Some(_) => Err(RpcError::new(INVALID_PARAMS, format!("{method} requires no parameters"))),
    }
}

fn mask(i: usize) -> u32 {
    if i == usize::MAX {
        (1 << FLAGS.len()) - 1
    } else {
        1 << i
    }
}

/// Registers the log methods (allowed in both RPC states, as in SPDK).
pub fn register(reg: &mut Registry) {
    let both = STARTUP | RUNTIME;
    reg.method_in("log_set_level", both, |_, p| async move {
        LOG_LEVEL.store(parse_level(p)?, Ordering::Relaxed);
        update_gate();
        Ok(json!(true))
    });
    reg.method_in("log_get_level", both, |_, p| async move {
        no_params(p, "log_get_level")?;
        Ok(json!(LEVELS[LOG_LEVEL.load(Ordering::Relaxed) as usize]))
    });
    reg.method_in("log_set_print_level", both, |_, p| async move {
        PRINT_LEVEL.store(parse_level(p)?, Ordering::Relaxed);
        update_gate();
        Ok(json!(true))
    });
    reg.method_in("log_get_print_level", both, |_, p| async move {
        no_params(p, "log_get_print_level")?;
        Ok(json!(LEVELS[PRINT_LEVEL.load(Ordering::Relaxed) as usize]))
    });
    reg.method_in("log_set_flag", both, |_, p| async move {
        FLAG_BITS.fetch_or(mask(parse_flag(p)?), Ordering::Relaxed);
        Ok(json!(true))
    });
    reg.method_in("log_clear_flag", both, |_, p| async move {
        FLAG_BITS.fetch_and(!mask(parse_flag(p)?), Ordering::Relaxed);
        Ok(json!(true))
    });
    reg.method_in("log_enable_timestamps", both, |_, p| async move {
        let fail = || RpcError::new(INTERNAL_ERROR, "spdk_json_decode_object failed");
        let Some(Value::Object(o)) = p.0 else { return Err(fail()) };
        let on = o.get("enabled").and_then(Value::as_bool).filter(|_| o.len() == 1).ok_or_else(fail)?;
        TIMESTAMPS.store(on, Ordering::Relaxed);
        Ok(json!(true))
    });
    reg.method_in("log_get_flags", both, |_, p| async move {
        no_params(p, "log_get_flags")?;
        let bits = FLAG_BITS.load(Ordering::Relaxed);
        let m: Map<String, Value> =
            FLAGS.iter().enumerate().map(|(i, f)| (f.to_string(), json!(bits & (1 << i) != 0))).collect();
        Ok(Value::Object(m))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_and_levels() {
        assert_eq!(flag_of("ferrite_bdev::rpc"), Some(1));
        assert_eq!(flag_of("ferrite::serve"), Some(0));
        assert_eq!(flag_of("io_uring"), None);
        assert_eq!(component("ferrite_iscsi_target::engine::conn"), "iscsi_target");
        assert_eq!(component("io_uring::squeue"), "io_uring");
        assert_eq!(parse_level(Params(Some(json!({"level": "warn"})))).unwrap(), 1);
        assert_eq!(parse_level(Params(Some(json!({"level": "LOUD"})))).unwrap_err().code, INTERNAL_ERROR);
        assert_eq!(parse_flag(Params(Some(json!({"flag": "x"})))).unwrap_err().code, INVALID_PARAMS);
    }
}
