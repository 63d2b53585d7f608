//! The target's global options (`iscsi_set_options`, SPDK's `spdk_iscsi_opts`) and the option
//! method itself, defined with SPDK v26.05's schema and defaults (`options.schema.json`,
//! `options.defaults.json` beside this file).
//!
//! Honoured: the engine reads every member through [`crate::options()`]; the registry itself
//! uses `node_base` (target names) and `max_queue_depth` (target queue depths), and the four
//! CHAP members are the discovery auth (which `iscsi_set_discovery_auth` changes later).
//! `error_recovery_level` keeps SPDK's range (0-2): it is what the engine offers in login
//! negotiation. Inert: the three pool sizes (Ferrite's buffers come from the reactors' pools).
//! Held to SPDK's default: `allow_duplicated_isid` (false) and `auth_file` (none: secrets come
//! from auth groups only). As in SPDK the method is startup-only and may be called once; its
//! values are checked as SPDK's start-up checks them (`iscsi_opts_verify`), but when called,
//! so a call SPDK's start would refuse is refused at once. `save_config` writes it with every
//! member, as SPDK does ([`OptionMethod::owner_saves`]).

use crate::chap::ChapParams;
use crate::limits::{MAX_BURST_LENGTH, MAX_NOP_IN_INTERVAL, MAX_QUEUE_DEPTH, MIN_FIRST_BURST_LENGTH};
use ferrite_rpc::jsonrpc::{INTERNAL_ERROR, INVALID_PARAMS};
use ferrite_rpc::options::{OptionMethod, Spec};
use ferrite_rpc::registry::STARTUP;
use ferrite_rpc::RpcError;
use serde_json::{json, Map, Value};

/// SPDK's schema of `iscsi_set_options`.
const SCHEMA: &str = include_str!("options.schema.json");
/// SPDK's defaults of `iscsi_set_options`.
const DEFAULTS: &str = include_str!("options.defaults.json");

/// SPDK's default node base.
pub const DEFAULT_NODE_BASE: &str = "iqn.2016-06.io.spdk";

/// The target's options, with SPDK's names and defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IscsiOptions {
    /// Prefix of target node names given without a type (`iqn.2016-06.io.spdk`).
    pub node_base: String,
    /// Sessions at once (128).
    pub max_sessions: u32,
    /// MaxConnections offered (2).
    pub max_connections_per_session: u32,
    /// Most commands outstanding per connection; target queue depths are clamped to it (64).
    pub max_queue_depth: u32,
    /// DefaultTime2Wait offered (2).
    pub default_time2wait: u32,
    /// DefaultTime2Retain offered (20).
    pub default_time2retain: u32,
    /// FirstBurstLength offered (8192).
    pub first_burst_length: u32,
    /// ImmediateData offered (true).
    pub immediate_data: bool,
    /// A session may reuse an ISID in use (false; held to it).
    pub allow_duplicated_isid: bool,
    /// ErrorRecoveryLevel offered (0; SPDK takes 0-2).
    pub error_recovery_level: u32,
    /// Seconds a NOP-In may go unanswered before the connection is dropped (60).
    pub nop_timeout: i32,
    /// Seconds between NOP-Ins on an idle connection (30).
    pub nop_in_interval: i32,
    /// The discovery sessions' CHAP settings (SPDK's disable/require/mutual_chap, chap_group).
    pub discovery: ChapParams,
    /// Large Data-In PDUs outstanding per connection (64).
    pub max_large_datain_per_connection: u32,
    /// R2Ts outstanding per connection (4).
    pub max_r2t_per_connection: u32,
    /// SPDK's PDU pool size (inert, kept for save_config).
    pub pdu_pool_size: u32,
    /// SPDK's immediate data buffer pool size (inert).
    pub immediate_data_pool_size: u32,
    /// SPDK's Data-Out buffer pool size (inert).
    pub data_out_pool_size: u32,
}

impl Default for IscsiOptions {
    fn default() -> Self {
        IscsiOptions {
            node_base: DEFAULT_NODE_BASE.into(),
            max_sessions: 128,
            max_connections_per_session: 2,
            max_queue_depth: 64,
            default_time2wait: 2,
            default_time2retain: 20,
            first_burst_length: 8192,
            immediate_data: true,
            allow_duplicated_isid: false,
            error_recovery_level: 0,
            nop_timeout: 60,
            nop_in_interval: 30,
            discovery: ChapParams::default(),
            max_large_datain_per_connection: 64,
            max_r2t_per_connection: 4,
            pdu_pool_size: 36864,
            immediate_data_pool_size: 16384,
            data_out_pool_size: 2048,
        }
    }
}

impl IscsiOptions {
    /// The defaults with the members of `p` (decoded by SPDK's schema already) over them.
    pub fn from_params(p: &Value) -> IscsiOptions {
        let mut o = IscsiOptions::default();
        let u = |k: &str, d: u32| p.get(k).and_then(Value::as_u64).map_or(d, |v| v as u32);
        let i = |k: &str, d: i32| p.get(k).and_then(Value::as_i64).map_or(d, |v| v as i32);
        let b = |k: &str, d: bool| p.get(k).and_then(Value::as_bool).unwrap_or(d);
        if let Some(s) = p.get("node_base").and_then(Value::as_str) {
            o.node_base = s.into();
        }
        o.max_sessions = u("max_sessions", o.max_sessions);
        o.max_connections_per_session = u("max_connections_per_session", o.max_connections_per_session);
        o.max_queue_depth = u("max_queue_depth", o.max_queue_depth);
        o.default_time2wait = u("default_time2wait", o.default_time2wait);
        o.default_time2retain = u("default_time2retain", o.default_time2retain);
        o.first_burst_length = u("first_burst_length", o.first_burst_length);
        o.immediate_data = b("immediate_data", o.immediate_data);
        o.allow_duplicated_isid = b("allow_duplicated_isid", o.allow_duplicated_isid);
        o.error_recovery_level = u("error_recovery_level", o.error_recovery_level);
        o.nop_timeout = i("nop_timeout", o.nop_timeout);
        o.nop_in_interval = i("nop_in_interval", o.nop_in_interval);
        o.discovery = ChapParams {
            disable: b("disable_chap", false),
            require: b("require_chap", false),
            mutual: b("mutual_chap", false),
            group: i("chap_group", 0),
        };
        o.max_large_datain_per_connection = u("max_large_datain_per_connection", o.max_large_datain_per_connection);
        o.max_r2t_per_connection = u("max_r2t_per_connection", o.max_r2t_per_connection);
        o.pdu_pool_size = u("pdu_pool_size", o.pdu_pool_size);
        o.immediate_data_pool_size = u("immediate_data_pool_size", o.immediate_data_pool_size);
        o.data_out_pool_size = u("data_out_pool_size", o.data_out_pool_size);
        o
    }

    /// SPDK's checks of the options (`iscsi_opts_verify`), with its messages.
    pub fn verify(&self) -> Result<(), String> {
        let o = self;
        if o.max_sessions == 0 || o.max_sessions > 65535 {
            return Err(format!(
                "{} is invalid. MaxSessions must be more than 0 and no more than 65535",
                o.max_sessions
            ));
        }
        if o.max_connections_per_session == 0 || o.max_connections_per_session > 65535 {
            return Err(format!(
                "{} is invalid. MaxConnectionsPerSession must be more than 0 and no more than 65535",
                o.max_connections_per_session
            ));
        }
        if o.max_queue_depth == 0 || o.max_queue_depth > MAX_QUEUE_DEPTH {
            return Err(format!(
                "{} is invalid. MaxQueueDepth must be more than 0 and no more than {MAX_QUEUE_DEPTH}",
                o.max_queue_depth
            ));
        }
        for (v, name) in [(o.default_time2wait, "DefaultTime2Wait"), (o.default_time2retain, "DefaultTime2Retain")] {
            if v > 3600 {
                return Err(format!("{v} is invalid. {name} must be no more than 3600"));
            }
        }
        if o.first_burst_length < MIN_FIRST_BURST_LENGTH {
            return Err(format!(
                "FirstBurstLength {} shall be no less than {MIN_FIRST_BURST_LENGTH}",
                o.first_burst_length
            ));
        }
        if o.first_burst_length > MAX_BURST_LENGTH {
            return Err(format!(
                "FirstBurstLength {} shall not exceed MaxBurstLength {MAX_BURST_LENGTH}",
                o.first_burst_length
            ));
        }
        if o.error_recovery_level > 2 {
            return Err(format!("ErrorRecoveryLevel {} is not supported.", o.error_recovery_level));
        }
        if o.nop_timeout < 0 {
            return Err(format!("{} is invalid. timeout must not be less than 0", o.nop_timeout));
        }
        if !(0..=MAX_NOP_IN_INTERVAL).contains(&o.nop_in_interval) {
            return Err(format!(
                "{} is invalid. nopinterval must be between 0 and {MAX_NOP_IN_INTERVAL}",
                o.nop_in_interval
            ));
        }
        o.discovery.check().map_err(|e| format!("CHAP params in opts are illegal combination: {e}"))?;
        for (v, name) in [
            (o.max_large_datain_per_connection, "MaxLargeDataInPerConnection"),
            (o.max_r2t_per_connection, "MaxR2TPerConnection"),
            (o.pdu_pool_size, "pdu_pool_size"),
            (o.immediate_data_pool_size, "immediate_data_pool_size"),
            (o.data_out_pool_size, "data_out_pool_size"),
        ] {
            if v == 0 {
                return Err(format!("0 is invalid. {name} must be more than 0"));
            }
        }
        Ok(())
    }

    /// The options as SPDK's `iscsi_get_options` and `save_config` write them, in its order.
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("node_base".into(), json!(self.node_base));
        m.insert("max_sessions".into(), json!(self.max_sessions));
        m.insert("max_connections_per_session".into(), json!(self.max_connections_per_session));
        m.insert("max_queue_depth".into(), json!(self.max_queue_depth));
        m.insert("default_time2wait".into(), json!(self.default_time2wait));
        m.insert("default_time2retain".into(), json!(self.default_time2retain));
        m.insert("first_burst_length".into(), json!(self.first_burst_length));
        m.insert("immediate_data".into(), json!(self.immediate_data));
        m.insert("allow_duplicated_isid".into(), json!(self.allow_duplicated_isid));
        m.insert("error_recovery_level".into(), json!(self.error_recovery_level));
        m.insert("nop_timeout".into(), json!(self.nop_timeout));
        m.insert("nop_in_interval".into(), json!(self.nop_in_interval));
        if let Value::Object(chap) = self.discovery.to_json() {
            m.extend(chap);
        }
        m.insert("max_large_datain_per_connection".into(), json!(self.max_large_datain_per_connection));
        m.insert("max_r2t_per_connection".into(), json!(self.max_r2t_per_connection));
        m.insert("pdu_pool_size".into(), json!(self.pdu_pool_size));
        m.insert("immediate_data_pool_size".into(), json!(self.immediate_data_pool_size));
        m.insert("data_out_pool_size".into(), json!(self.data_out_pool_size));
        Value::Object(m)
    }
}

/// SPDK's refusal of a second call, then its start-up checks of the values.
fn check(p: &Value) -> Result<(), RpcError> {
    if crate::state::with_read(|s| s.options_set) {
        return Err(RpcError::new(INTERNAL_ERROR, "Must not call more than once"));
    }
    IscsiOptions::from_params(p).verify().map_err(|e| RpcError::new(INVALID_PARAMS, format!("Invalid parameters: {e}")))
}

/// Makes the call's options the target's.
fn apply(p: &Value) {
    let o = IscsiOptions::from_params(p);
    debug_assert!(o.verify().is_ok(), "checked before it was kept");
    log::info!("iscsi: options set (node base {}, max queue depth {})", o.node_base, o.max_queue_depth);
    crate::state::with_write(|s| {
        s.options = o;
        s.options_set = true;
    });
}

/// `iscsi_set_options`.
pub static ISCSI_SET_OPTIONS: OptionMethod = OptionMethod {
    honoured: &[
        "node_base",
        "max_sessions",
        "max_connections_per_session",
        "max_queue_depth",
        "default_time2wait",
        "default_time2retain",
        "first_burst_length",
        "immediate_data",
        "error_recovery_level",
        "nop_timeout",
        "nop_in_interval",
        "disable_chap",
        "require_chap",
        "mutual_chap",
        "chap_group",
        "max_large_datain_per_connection",
        "max_r2t_per_connection",
    ],
    inert: &["pdu_pool_size", "immediate_data_pool_size", "data_out_pool_size"],
    apply: Some(apply),
    owner_saves: true,
    ..OptionMethod::new(
        Spec { check: Some(check), ..Spec::new("iscsi_set_options", "iscsi", STARTUP, INVALID_PARAMS, true) },
        SCHEMA,
        DEFAULTS,
    )
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spdks_schema_and_defaults_cover_the_honoured_members() {
        ISCSI_SET_OPTIONS.validate().unwrap_or_else(|e| panic!("{e}"));
        let defaults: Value = serde_json::from_str(DEFAULTS).unwrap();
        assert_eq!(IscsiOptions::default().to_json(), defaults["defaults"]["iscsi_set_options"]);
        assert_eq!(IscsiOptions::from_params(&json!({})), IscsiOptions::default());
    }

    #[test]
    fn calls_are_checked_as_spdk_checks_its_options() {
        let call = |p: Value| ISCSI_SET_OPTIONS.check_call(Some(p));
        assert!(call(json!({"max_sessions": 4, "max_queue_depth": 128, "node_base": "iqn.2020-01.x"})).is_ok());
        assert!(call(json!({"pdu_pool_size": 4})).is_ok(), "inert");
        assert!(call(json!({"error_recovery_level": 2})).is_ok(), "SPDK's range");
        for (bad, says) in [
            (json!({"max_sessions": 0}), "MaxSessions"),
            (json!({"max_queue_depth": 257}), "MaxQueueDepth"),
            (json!({"first_burst_length": 511}), "FirstBurstLength"),
            (json!({"first_burst_length": 1048577}), "MaxBurstLength"),
            (json!({"error_recovery_level": 3}), "ErrorRecoveryLevel"),
            (json!({"nop_in_interval": 61}), "nopinterval"),
            (json!({"nop_timeout": -1}), "timeout"),
            (json!({"default_time2wait": 3601}), "DefaultTime2Wait"),
            (json!({"disable_chap": true, "require_chap": true}), "CHAP"),
            (json!({"chap_group": -1}), "CHAP"),
            (json!({"max_r2t_per_connection": 0}), "MaxR2TPerConnection"),
            (json!({"pdu_pool_size": 0}), "pdu_pool_size"),
            (json!({"allow_duplicated_isid": true}), "allow_duplicated_isid"),
            (json!({"auth_file": "/etc/secrets"}), "auth_file"),
            (json!({"max_sessions": "many"}), "max_sessions"),
        ] {
            let e = call(bad.clone()).unwrap_err();
            assert!(e.code == INVALID_PARAMS && e.message.contains(says), "{bad}: {e:?}");
        }
    }
}
