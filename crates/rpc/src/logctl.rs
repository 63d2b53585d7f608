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

/// Params of the level setters: the level's index in [`LEVELS`] once decoded.
#[derive(schemars::JsonSchema)]
#[allow(dead_code)]
struct LevelParams {
    /// `ERROR`, `WARNING` (or `WARN`), `NOTICE`, `INFO` or `DEBUG`, in any case.
    #[schemars(example = &"NOTICE")]
    level: String,
}

/// A level, as its index in [`LEVELS`].
#[derive(schemars::JsonSchema)]
#[schemars(with = "LevelParams")]
struct LevelIx(u8);

/// Params of the flag methods: the flag's index in [`FLAGS`] (`usize::MAX`: all) once decoded.
#[derive(schemars::JsonSchema)]
#[allow(dead_code)]
struct FlagParams {
    /// A log flag (see `log_get_flags`) or `all`.
    #[schemars(example = &"all")]
    flag: String,
}

/// A flag, as its index in [`FLAGS`] (`usize::MAX`: all).
#[derive(schemars::JsonSchema)]
#[schemars(with = "FlagParams")]
struct Flag(usize);

/// Params of `log_enable_timestamps`.
#[derive(schemars::JsonSchema)]
struct Timestamps {
    /// Whether log lines carry a timestamp.
    enabled: bool,
}

/// Decodes `log_enable_timestamps`'s params as SPDK's decoder does.
fn parse_timestamps(_: &'static str, p: Params) -> Result<Timestamps, RpcError> {
    let fail = || RpcError::new(INTERNAL_ERROR, "spdk_json_decode_object failed");
    let Some(Value::Object(o)) = p.0 else { return Err(fail()) };
    let enabled = o.get("enabled").and_then(Value::as_bool).filter(|_| o.len() == 1).ok_or_else(fail)?;
    Ok(Timestamps { enabled })
}

/// Parses a level name as SPDK's decoder does (case-insensitive; WARN for WARNING too).
fn parse_level(_: &'static str, p: Params) -> Result<LevelIx, RpcError> {
    let fail = || RpcError::new(INTERNAL_ERROR, "spdk_json_decode_object failed");
    let Some(Value::Object(o)) = p.0 else { return Err(fail()) };
    if o.len() != 1 {
        return Err(fail());
    }
    let name = o.get("level").and_then(Value::as_str).ok_or_else(fail)?.to_ascii_uppercase();
    let name = if name == "WARN" { "WARNING".to_string() } else { name };
    LEVELS
        .iter()
        .position(|l| *l == name)
        .map(|i| LevelIx(i as u8))
        .ok_or_else(|| RpcError::new(INVALID_PARAMS, "invalid log level"))
}

/// Parses a flag name as SPDK's decoder does.
fn parse_flag(_: &'static str, p: Params) -> Result<Flag, RpcError> {
    let fail = || RpcError::new(INTERNAL_ERROR, "spdk_json_decode_object failed");
    let Some(Value::Object(o)) = p.0 else { return Err(fail()) };
    if o.len() != 1 {
        return Err(fail());
    }
    let name = o.get("flag").and_then(Value::as_str).ok_or_else(fail)?;
    if name == "all" {
        return Ok(Flag(usize::MAX));
    }
    FLAGS.iter().position(|f| *f == name).map(Flag).ok_or_else(|| RpcError::new(INVALID_PARAMS, "invalid log flag"))
}

fn no_params(method: &'static str, p: Params) -> Result<(), RpcError> {
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
    reg.typed_with(
        "log_set_level",
        both,
        "Sets the level of what is logged.",
        parse_level,
        |_, l: LevelIx| async move {
            LOG_LEVEL.store(l.0, Ordering::Relaxed);
            update_gate();
            Ok(json!(true))
        },
    );
    reg.bare_with("log_get_level", both, "The level of what is logged.", no_params, |_| async move {
        Ok(json!(LEVELS[LOG_LEVEL.load(Ordering::Relaxed) as usize]))
    });
    reg.typed_with(
        "log_set_print_level",
        both,
        "Sets the level of what is printed.",
        parse_level,
        |_, l: LevelIx| async move {
            PRINT_LEVEL.store(l.0, Ordering::Relaxed);
            update_gate();
            Ok(json!(true))
        },
    );
    reg.bare_with("log_get_print_level", both, "The level of what is printed.", no_params, |_| async move {
        Ok(json!(LEVELS[PRINT_LEVEL.load(Ordering::Relaxed) as usize]))
    });
    reg.typed_with(
        "log_set_flag",
        both,
        "Enables a log flag (a component's debug messages).",
        parse_flag,
        |_, f: Flag| async move {
            FLAG_BITS.fetch_or(mask(f.0), Ordering::Relaxed);
            Ok(json!(true))
        },
    );
    reg.typed_with("log_clear_flag", both, "Disables a log flag.", parse_flag, |_, f: Flag| async move {
        FLAG_BITS.fetch_and(!mask(f.0), Ordering::Relaxed);
        Ok(json!(true))
    });
    let summary = "Turns timestamps in log lines on or off.";
    reg.typed_with("log_enable_timestamps", both, summary, parse_timestamps, |_, t: Timestamps| async move {
        TIMESTAMPS.store(t.enabled, Ordering::Relaxed);
        Ok(json!(true))
    });
    reg.bare_with("log_get_flags", both, "Every log flag and whether it is on.", no_params, |_| async move {
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
        assert_eq!(parse_level("", Params(Some(json!({"level": "warn"})))).ok().map(|l| l.0), Some(1));
        assert_eq!(parse_level("", Params(Some(json!({"level": "LOUD"})))).err().map(|e| e.code), Some(INVALID_PARAMS));
        assert_eq!(parse_flag("", Params(Some(json!({"flag": "x"})))).err().map(|e| e.code), Some(INVALID_PARAMS));
    }
}
