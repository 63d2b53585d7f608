//! `bdev_raid_set_options`, with SPDK v26.05's schema and defaults (`options.schema.json`,
//! `options.defaults.json`): `process_window_size_kb` (1024) and `process_max_bandwidth_mb_sec`
//! (0: no limit) are what a rebuild started afterwards uses. The RPC registry keeps what was
//! set for `save_config`; the RAID RPCs copy it here for the rebuilds examine starts.

use crate::process::Opts;
use ferrite_rpc::jsonrpc::PARSE_ERROR;
use ferrite_rpc::options::{OptionMethod, Spec};
use ferrite_rpc::registry::{RUNTIME, STARTUP};
use ferrite_rpc::Registry;
use serde_json::Value;

/// SPDK's schema of the method.
const SCHEMA: &str = include_str!("options.schema.json");
/// SPDK's defaults of the method.
const DEFAULTS: &str = include_str!("options.defaults.json");

/// `bdev_raid_set_options`.
pub static BDEV_RAID_SET_OPTIONS: OptionMethod = OptionMethod {
    honoured: &["process_window_size_kb", "process_max_bandwidth_mb_sec"],
    ..OptionMethod::new(
        Spec::new("bdev_raid_set_options", "bdev", STARTUP | RUNTIME, PARSE_ERROR, true),
        SCHEMA,
        DEFAULTS,
    )
};

/// Registers the option method.
pub fn register(reg: &mut Registry) {
    reg.option_method(&BDEV_RAID_SET_OPTIONS);
}

#[derive(Default)]
struct Current(Option<Opts>);

/// The options after the calls that left `set` (the merged members of every call so far); a
/// window of 0 (which SPDK refuses) counts as the default.
pub fn from_set(set: Option<&Value>) -> Opts {
    let d = Opts::default();
    let get = |k: &str, d: u32| set.and_then(|v| v[k].as_u64()).map_or(d, |x| x as u32);
    let window_kb = match get("process_window_size_kb", d.window_kb) {
        0 => d.window_kb,
        w => w,
    };
    Opts { window_kb, max_bandwidth_mb_sec: get("process_max_bandwidth_mb_sec", d.max_bandwidth_mb_sec) }
}

/// Records the options the registry holds now (each RAID RPC does).
pub fn note(reg: &Registry) {
    let o = from_set(reg.settings().get("bdev_raid_set_options", None).as_ref());
    ferrite_reactor::lock_state::<Current>().0 = Some(o);
}

/// The options last recorded (SPDK's defaults before any).
pub fn current() -> Opts {
    ferrite_reactor::lock_state::<Current>().0.unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn spdks_schema_and_defaults_hold_both_members() {
        BDEV_RAID_SET_OPTIONS.validate().unwrap();
        let call = |p: Value| BDEV_RAID_SET_OPTIONS.check_call(Some(p));
        assert!(call(json!({"process_window_size_kb": 64, "process_max_bandwidth_mb_sec": 10})).is_ok());
        assert_eq!(call(json!({"frob": 1})).unwrap_err().code, PARSE_ERROR);
        assert_eq!(from_set(None), Opts::default());
        assert_eq!(
            from_set(Some(&json!({"process_window_size_kb": 64, "process_max_bandwidth_mb_sec": 10}))),
            Opts { window_kb: 64, max_bandwidth_mb_sec: 10 }
        );
        assert_eq!(from_set(Some(&json!({"process_window_size_kb": 0}))).window_kb, 1024);
    }
}
