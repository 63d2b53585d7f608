//! The NVMe-oF target's JSON-RPC methods, with SPDK's names, parameters and results
//! (lib/nvmf/nvmf_rpc.c), and the "nvmf" subsystem of save_config, so SPDK's nvmf configs load
//! unchanged. Methods run on the first reactor, which also owns the listeners.

use super::admin;
use super::ctrlr::Ctrlr;
use super::exec;
use super::model::{self, tables, AnaState, Namespace, Referral, Subsystem, TransportOpts, Trid};
use super::qpair;
use crate::spec::nqn;
use ferrite_rpc::registry::{MethodDoc, RUNTIME};
use ferrite_rpc::{errno_error, Params, Registry, RpcError};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::sync::Arc;

fn invalid(msg: impl Into<String>) -> RpcError {
    RpcError::invalid_params(msg.into())
}

/// An SPDK parameter asking for a feature the target lacks, where ignoring it would mislead
/// (hosts would be told, or trusted with, something that is not so): -32602 naming it.
fn lacks(param: &str, why: &str) -> RpcError {
    invalid(format!("Invalid parameters: {param} is not supported: {why}"))
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct ListenAddress {
    /// Transport type: `tcp`.
    #[schemars(example = &"tcp")]
    trtype: String,
    /// Address family: `ipv4` or `ipv6`.
    #[schemars(example = &"ipv4")]
    adrfam: Option<String>,
    /// Transport address (an IP address).
    #[schemars(example = &"127.0.0.1")]
    traddr: String,
    /// Transport service ID (the TCP port).
    #[serde(default, deserialize_with = "port_text")]
    #[schemars(example = &"4420")]
    trsvcid: Option<String>,
}

impl ListenAddress {
    fn trid(&self) -> Result<Trid, RpcError> {
        if !self.trtype.eq_ignore_ascii_case("tcp") {
            return Err(invalid(format!(
                "Invalid parameters: transport type {} is not supported (TCP only)",
                self.trtype
            )));
        }
        let adrfam = match self.adrfam.as_deref().unwrap_or("IPv4") {
            f if f.eq_ignore_ascii_case("ipv4") => "IPv4",
            f if f.eq_ignore_ascii_case("ipv6") => "IPv6",
            f => return Err(invalid(format!("Invalid parameters: address family {f} is not supported"))),
        };
        let trsvcid = self.trsvcid.clone().unwrap_or_else(|| "4420".into());
        // Port 0 would bind a port the kernel picks while hosts (and discovery) are told 0.
        if trsvcid.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(invalid(format!("Invalid parameters: trsvcid {trsvcid} is not a port (1-65535)")));
        }
        // The address must be of the family given (SPDK refuses the mix too).
        match self.traddr.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V4(_)) if adrfam == "IPv4" => {}
            Ok(std::net::IpAddr::V6(_)) if adrfam == "IPv6" => {}
            _ => return Err(invalid(format!("Invalid parameters: traddr {} is not an {adrfam} address", self.traddr))),
        }
        Ok(Trid { adrfam: adrfam.into(), traddr: self.traddr.clone(), trsvcid })
    }
}

fn no_subsystem(nqn: &str) -> RpcError {
    invalid(format!("Subsystem with NQN '{nqn}' not found"))
}

fn hex_bytes<const N: usize>(s: &str) -> Result<[u8; N], RpcError> {
    let h: String = s.chars().filter(|c| *c != '-').collect();
    if h.len() != N * 2 {
        return Err(invalid(format!("Invalid parameters: {s} is not {N} bytes of hex")));
    }
    let mut out = [0u8; N];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&h[2 * i..2 * i + 2], 16)
            .map_err(|_| invalid(format!("Invalid parameters: bad hex {s}")))?;
    }
    Ok(out)
}

fn hex_string(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02X}")).collect()
}

fn uuid_string(b: &[u8; 16]) -> String {
    uuid::Uuid::from_bytes(*b).hyphenated().to_string()
}

// ---------------------------------------------------------------- transport

fn transport_json(o: &TransportOpts) -> Value {
    let mut m = Map::new();
    m.insert("trtype".into(), json!("TCP"));
    m.insert("max_queue_depth".into(), json!(o.max_queue_depth));
    m.insert("max_io_qpairs_per_ctrlr".into(), json!(o.max_qpairs_per_ctrlr.saturating_sub(1)));
    m.insert("in_capsule_data_size".into(), json!(o.in_capsule_data_size));
    m.insert("max_io_size".into(), json!(o.max_io_size));
    m.insert("io_unit_size".into(), json!(o.io_unit_size));
    m.insert("max_aq_depth".into(), json!(o.max_aq_depth));
    m.insert("abort_timeout_sec".into(), json!(o.abort_timeout_sec));
    m.insert("c2h_success".into(), json!(o.c2h_success));
    m.insert("sock_priority".into(), json!(o.sock_priority));
    for (k, v) in &o.extra {
        m.entry(k.clone()).or_insert_with(|| v.clone());
    }
    Value::Object(m)
}

fn num<T: TryFrom<u64>>(m: &Map<String, Value>, k: &str) -> Result<Option<T>, RpcError> {
    match m.get(k) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| T::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| invalid(format!("Invalid parameters: {k} must be a number in range"))),
    }
}

/// What `nvmf_create_transport` takes (decoded by hand in [`create_transport`]: members beyond
/// these are kept and written back by save_config).
#[derive(schemars::JsonSchema)]
#[allow(dead_code)]
struct TransportParams {
    /// The transport: `TCP` (any case) only.
    #[schemars(example = &"TCP")]
    trtype: String,
    /// SPDK's target name (one target here).
    tgt_name: Option<String>,
    /// Entries of an I/O queue (at least 2).
    max_queue_depth: Option<u16>,
    /// I/O queues per controller (admin queue not counted).
    max_io_qpairs_per_ctrlr: Option<u16>,
    /// Queues per controller, the admin queue counted (SPDK's deprecated form).
    max_qpairs_per_ctrlr: Option<u16>,
    /// Bytes of data a command capsule may carry (a multiple of 16, at most 128 KiB).
    in_capsule_data_size: Option<u32>,
    /// Largest I/O in bytes (4 KiB to 32 MiB).
    max_io_size: Option<u32>,
    /// I/O unit size in bytes (kept and reported).
    io_unit_size: Option<u32>,
    /// Entries of the admin queue (at least 2).
    max_aq_depth: Option<u16>,
    /// Seconds before an abort gives up.
    abort_timeout_sec: Option<u32>,
    /// SO_PRIORITY of the connections' sockets.
    sock_priority: Option<u32>,
    /// Whether a read's last data PDU carries the success flag (no response capsule).
    c2h_success: Option<bool>,
    /// ONCS features to hide (Ferrite cannot hide the ones it has: `nvmcmps`, `nvmdsmsv`, `nvmwzsv`).
    masked_oncs: Option<Vec<String>>,
    /// Fused operations to hide (`fcws` cannot be hidden).
    masked_fuses: Option<Vec<String>>,
}

fn create_transport(p: Params) -> Result<Value, RpcError> {
    let Some(Value::Object(m)) = p.0 else { return Err(invalid("Invalid parameters: trtype is required")) };
    let Some(trtype) = m.get("trtype").and_then(|v| v.as_str()) else {
        return Err(invalid("Invalid parameters: trtype is required"));
    };
    if !trtype.eq_ignore_ascii_case("tcp") {
        return Err(invalid(format!("Invalid parameters: transport type {trtype} is not supported (TCP only)")));
    }
    let mut o = TransportOpts::default();
    if let Some(v) = num(&m, "max_queue_depth")? {
        o.max_queue_depth = v;
    }
    if let Some(v) = num::<u16>(&m, "max_io_qpairs_per_ctrlr")? {
        o.max_qpairs_per_ctrlr = v.saturating_add(1);
    }
    if let Some(v) = num(&m, "max_qpairs_per_ctrlr")? {
        o.max_qpairs_per_ctrlr = v;
    }
    if let Some(v) = num(&m, "in_capsule_data_size")? {
        o.in_capsule_data_size = v;
    }
    if let Some(v) = num(&m, "max_io_size")? {
        o.max_io_size = v;
    }
    if let Some(v) = num(&m, "io_unit_size")? {
        o.io_unit_size = v;
    }
    if let Some(v) = num(&m, "max_aq_depth")? {
        o.max_aq_depth = v;
    }
    if let Some(v) = num(&m, "abort_timeout_sec")? {
        o.abort_timeout_sec = v;
    }
    if let Some(v) = num(&m, "sock_priority")? {
        o.sock_priority = v;
    }
    if let Some(v) = m.get("c2h_success") {
        o.c2h_success = v.as_bool().ok_or_else(|| invalid("Invalid parameters: c2h_success must be a bool"))?;
    }
    if o.max_queue_depth < 2 || o.max_aq_depth < 2 {
        return Err(invalid("Invalid parameters: queue depths must be at least 2"));
    }
    if o.max_qpairs_per_ctrlr < 2 {
        return Err(invalid("Invalid parameters: max_qpairs_per_ctrlr must be at least 2"));
    }
    if o.in_capsule_data_size % 16 != 0 || o.in_capsule_data_size > 131_072 {
        return Err(invalid("Invalid parameters: in_capsule_data_size must be a multiple of 16, at most 128 KiB"));
    }
    if o.io_unit_size == 0 {
        // Kept and reported only (buffers come from the reactor's pool), but 0 is no size.
        return Err(invalid("Invalid parameters: io_unit_size must be greater than 0"));
    }
    if !(4096..=(32 << 20)).contains(&o.max_io_size) {
        return Err(invalid("Invalid parameters: max_io_size must be 4 KiB to 32 MiB"));
    }
    // Masks of what Identify Controller advertises: Ferrite advertises Compare, Dataset
    // Management, Write Zeroes and fused Compare and Write, and cannot hide them; reservations
    // it hides (`TransportOpts::reservations_masked`); Copy it has none of.
    for (k, shown) in [("masked_oncs", &["nvmcmps", "nvmdsmsv", "nvmwzsv"][..]), ("masked_fuses", &["fcws"][..])] {
        let Some(v) = m.get(k) else { continue };
        let names = v.as_array().ok_or_else(|| invalid(format!("Invalid parameters: {k} must be an array")))?;
        if let Some(n) = names.iter().filter_map(|n| n.as_str()).find(|n| shown.contains(n)) {
            return Err(lacks(&format!("{k} {n}"), "the target cannot stop advertising it"));
        }
    }
    let known = [
        "trtype",
        "tgt_name",
        "max_queue_depth",
        "max_io_qpairs_per_ctrlr",
        "max_qpairs_per_ctrlr",
        "in_capsule_data_size",
        "max_io_size",
        "io_unit_size",
        "max_aq_depth",
        "abort_timeout_sec",
        "sock_priority",
        "c2h_success",
    ];
    o.extra = m.into_iter().filter(|(k, _)| !known.contains(&k.as_str())).collect();
    let mut t = tables();
    if t.transport.is_some() {
        return Err(errno_error(libc::EEXIST, "Transport type 'TCP' already exists"));
    }
    t.transport = Some(o);
    log::info!("NVMe/TCP transport created");
    Ok(json!(true))
}

// ---------------------------------------------------------------- subsystems

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct CreateSubsystem {
    /// The subsystem's NQN.
    #[schemars(example = &"nqn.2016-06.io.spdk:cnode1")]
    nqn: String,
    /// Serial number.
    serial_number: Option<String>,
    /// Model number.
    model_number: Option<String>,
    /// Any host may connect.
    #[serde(default)]
    allow_any_host: bool,
    /// Most namespaces (0: SPDK's default).
    max_namespaces: Option<u32>,
    /// SPDK's target name (Ferrite has one target; any value names it).
    #[allow(dead_code)]
    tgt_name: Option<String>,
    /// Lowest controller ID.
    min_cntlid: Option<u16>,
    /// Highest controller ID.
    max_cntlid: Option<u16>,
    /// ANA reporting.
    #[serde(default)]
    ana_reporting: bool,
    // Size limits hosts are told in Identify Controller (0: none, which is what Ferrite
    // reports); SPDK v26.05 takes the KiB forms (deprecated) and DMRSL/WZSL themselves.
    /// Discard limit in KiB (0 or SPDK's default).
    max_discard_size_kib: Option<u64>,
    /// Write Zeroes limit in KiB (0 or SPDK's default).
    max_write_zeroes_size_kib: Option<u64>,
    /// SPDK's DMRSL (0 or its default).
    dmrsl: Option<u32>,
    /// SPDK's WZSL (0 or its default).
    wzsl: Option<u8>,
    /// SPDK's passthrough of identify data (only false).
    passthrough: Option<bool>,
    /// NVM subsystem reset (only false).
    enable_nssr: Option<bool>,
    /// SPDK's admin label (kept).
    #[allow(dead_code)]
    admin_label: Option<String>,
}

fn check_text(what: &str, s: &str, max: usize) -> Result<(), RpcError> {
    if s.is_empty() || s.len() > max || !s.bytes().all(|b| (0x20..0x7f).contains(&b)) {
        return Err(invalid(format!("Invalid parameters: {what} must be 1 to {max} printable ASCII characters")));
    }
    Ok(())
}

/// SPDK's default `dmrsl` of a subsystem (what its `save_config` writes when none was given).
const SPDK_DMRSL: u64 = 2_097_152;
/// SPDK's default `wzsl` of a subsystem.
const SPDK_WZSL: u64 = 12;

fn create_subsystem(a: CreateSubsystem, max_subsystems: usize) -> Result<Value, RpcError> {
    // SPDK v26.05 saves every subsystem with its defaults (dmrsl 2097152 blocks, wzsl 12: 16 MiB):
    // those load, as 0 does; Ferrite tells hosts no limit and splits what it must itself.
    let limits = [
        ("max_discard_size_kib", a.max_discard_size_kib.unwrap_or(0), 0),
        ("max_write_zeroes_size_kib", a.max_write_zeroes_size_kib.unwrap_or(0), 0),
        ("dmrsl", u64::from(a.dmrsl.unwrap_or(0)), SPDK_DMRSL),
        ("wzsl", u64::from(a.wzsl.unwrap_or(0)), SPDK_WZSL),
    ];
    if let Some((k, _, _)) = limits.iter().find(|(_, v, spdk)| *v != 0 && v != spdk) {
        return Err(lacks(
            k,
            "Ferrite tells hosts no Dataset Management or Write Zeroes size limit (0 or SPDK's default only)",
        ));
    }
    if a.passthrough == Some(true) {
        return Err(lacks("passthrough", "NVMe commands are not passed through to an NVMe bdev"));
    }
    if a.enable_nssr == Some(true) {
        return Err(lacks("enable_nssr", "no NVM subsystem reset"));
    }
    nqn::validate(&a.nqn).map_err(|e| invalid(format!("Invalid parameters: NQN {}: {e}", a.nqn)))?;
    if a.nqn == nqn::DISCOVERY_NQN {
        return Err(errno_error(libc::EEXIST, format!("Unable to create subsystem {}", a.nqn)));
    }
    let mut s = Subsystem::new(&a.nqn, false);
    if let Some(sn) = &a.serial_number {
        check_text("serial_number", sn, 20)?;
        s.serial = sn.clone();
    }
    if let Some(mn) = &a.model_number {
        check_text("model_number", mn, 40)?;
        s.model = mn.clone();
    }
    s.allow_any_host = a.allow_any_host;
    if let Some(n) = a.max_namespaces.filter(|&n| n > 0) {
        if n > model::DEFAULT_MAX_NAMESPACES {
            return Err(invalid(format!(
                "Invalid parameters: max_namespaces at most {}",
                model::DEFAULT_MAX_NAMESPACES
            )));
        }
        s.max_namespaces = n;
        s.max_namespaces_given = n;
    }
    let (min, max) = (a.min_cntlid.unwrap_or(1), a.max_cntlid.unwrap_or(model::MAX_CNTLID));
    if min == 0 || max > model::MAX_CNTLID || min > max {
        return Err(invalid(format!("Invalid cntlid range [{min}-{max}]")));
    }
    s.min_cntlid = min;
    s.max_cntlid = max;
    s.next_cntlid = min;
    s.ana_reporting = a.ana_reporting;
    let mut t = tables();
    if t.subsystems.contains_key(&a.nqn) {
        return Err(errno_error(libc::EEXIST, format!("Unable to create subsystem {}", a.nqn)));
    }
    // The discovery subsystem counts, as in SPDK.
    if t.subsystems.len() >= max_subsystems {
        return Err(errno_error(libc::ENOSPC, format!("Unable to create subsystem {}: limit reached", a.nqn)));
    }
    t.subsystems.insert(a.nqn.clone(), s);
    admin::notify_discovery_changed(&mut t);
    log::info!("nvmf subsystem {} created", a.nqn);
    Ok(json!(true))
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Nqn {
    /// The subsystem's NQN.
    nqn: String,
    /// SPDK's target name (Ferrite has one target; any value names it).
    #[allow(dead_code)]
    tgt_name: Option<String>,
}

/// Closes every connection of subsystem `nqn` (optionally only through `trid`) on every
/// reactor.
async fn close_conns(ctx: &ferrite_rpc::Ctx, nqn: String, trid: Option<Trid>) -> usize {
    ctx.engine
        .on_all(move |_| {
            qpair::close_local(&|c: &qpair::Conn| {
                c.ctrl().is_some_and(|x| x.subnqn == nqn) && trid.as_ref().is_none_or(|t| &c.trid == t)
            })
        })
        .await
        .unwrap_or_default()
        .iter()
        .sum()
}

/// Drops cached channels of removed namespaces on every reactor.
async fn purge(ctx: &ferrite_rpc::Ctx) {
    let _ = ctx.engine.on_all(|_| qpair::purge_namespaces_local()).await;
}

/// Stops listeners no subsystem uses any more.
fn prune_listeners(t: &model::Tables, was: &[Trid]) {
    let now = t.listen_addrs();
    for trid in was {
        if !now.contains(trid) {
            super::listen::unlisten(trid);
        }
    }
}

fn subsystem_json(s: &Subsystem) -> Value {
    let mut v = json!({
        "nqn": s.nqn,
        "subtype": if s.discovery { "Discovery" } else { "NVMe" },
        "listen_addresses": s.listeners.iter().map(|l| l.trid.to_json()).collect::<Vec<_>>(),
        "allow_any_host": s.allow_any_host,
        "hosts": s.hosts.iter().map(|h| json!({"nqn": h})).collect::<Vec<_>>(),
    });
    if !s.discovery {
        v["serial_number"] = json!(s.serial);
        v["model_number"] = json!(s.model);
        if s.max_namespaces_given != 0 {
            v["max_namespaces"] = json!(s.max_namespaces_given);
        }
        v["min_cntlid"] = json!(s.min_cntlid);
        v["max_cntlid"] = json!(s.max_cntlid);
        v["namespaces"] = Value::Array(s.namespaces.values().map(|n| ns_json(s, n)).collect());
    }
    v
}

fn ns_json(s: &Subsystem, n: &Namespace) -> Value {
    let mut v = json!({"nsid": n.nsid, "bdev_name": n.bdev_name, "name": n.bdev_name});
    if n.nguid != [0; 16] {
        v["nguid"] = json!(hex_string(&n.nguid));
    }
    if n.eui64 != [0; 8] {
        v["eui64"] = json!(hex_string(&n.eui64));
    }
    if n.uuid != [0; 16] {
        v["uuid"] = json!(uuid_string(&n.uuid));
    }
    if s.ana_reporting {
        v["anagrpid"] = json!(n.anagrpid);
    }
    if let Some(f) = &n.ptpl_file {
        v["ptpl_file"] = json!(f);
    }
    v
}

/// Params of the methods that take only the target's name (there is one target).
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct TgtOnly {
    /// SPDK's target name (Ferrite has one target; any value names it).
    #[allow(dead_code)]
    tgt_name: Option<String>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct GetSubsystems {
    /// The subsystem's NQN.
    nqn: Option<String>,
    /// SPDK's target name (Ferrite has one target; any value names it).
    #[allow(dead_code)]
    tgt_name: Option<String>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Listener {
    /// The subsystem's NQN.
    #[schemars(example = &"nqn.2016-06.io.spdk:cnode1")]
    nqn: String,
    /// The address.
    listen_address: ListenAddress,
    /// SPDK's target name (Ferrite has one target; any value names it).
    #[allow(dead_code)]
    tgt_name: Option<String>,
    /// SPDK's TLS flag (Ferrite has no TLS: only false).
    #[serde(default)]
    secure_channel: bool,
    /// SPDK's socket implementation (kept; Ferrite has one).
    sock_impl: Option<String>,
    /// ANA state: `optimized`, `non_optimized`, `inaccessible` (and SPDK's others).
    ana_state: Option<String>,
    /// ANA group ID.
    anagrpid: Option<u32>,
    // rpc.py v26.05 sends it; SPDK's relaxed decoder drops it too (no per-node listeners).
    /// SPDK's NUMA node (-1: any); Ferrite places memory where the kernel does.
    #[allow(dead_code)]
    numa_id: Option<i32>,
}

impl Listener {
    /// Refuses what would need TLS (a secure channel, the ssl socket implementation).
    fn check_plain(&self) -> Result<(), RpcError> {
        if self.secure_channel {
            return Err(lacks("secure_channel", "the target has no TLS"));
        }
        if self.sock_impl.as_deref().is_some_and(|i| i.eq_ignore_ascii_case("ssl")) {
            return Err(lacks("sock_impl ssl", "the target has no TLS"));
        }
        Ok(())
    }
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct NsParams {
    /// The bdev.
    #[schemars(example = &"Malloc0")]
    bdev_name: String,
    /// Namespace ID (the next free one if not given).
    nsid: Option<u32>,
    /// NGUID (32 hex digits).
    nguid: Option<String>,
    /// EUI-64 (16 hex digits).
    eui64: Option<String>,
    /// The namespace's UUID (the bdev's if not given).
    uuid: Option<String>,
    /// ANA group ID.
    anagrpid: Option<u32>,
    /// File persisting reservations through power loss.
    ptpl_file: Option<String>,
    /// Hidden until nvmf_ns_add_host (only false).
    no_auto_visible: Option<bool>,
    // Ferrite's bdevs carry no metadata, so there is none to hide.
    /// SPDK's (only false).
    #[allow(dead_code)]
    hide_metadata: Option<bool>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct AddNs {
    /// The subsystem's NQN.
    #[schemars(example = &"nqn.2016-06.io.spdk:cnode1")]
    nqn: String,
    /// The namespace.
    namespace: NsParams,
    /// SPDK's target name (Ferrite has one target; any value names it).
    #[allow(dead_code)]
    tgt_name: Option<String>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RemoveNs {
    /// The subsystem's NQN.
    nqn: String,
    /// Namespace ID.
    nsid: u32,
    /// SPDK's target name (Ferrite has one target; any value names it).
    #[allow(dead_code)]
    tgt_name: Option<String>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Host {
    /// The subsystem's NQN.
    nqn: String,
    /// The host's NQN.
    host: String,
    /// SPDK's target name (Ferrite has one target; any value names it).
    #[allow(dead_code)]
    tgt_name: Option<String>,
    /// TLS PSK (SPDK's; Ferrite has no TLS).
    psk: Option<String>,
    /// DH-HMAC-CHAP key (SPDK's; Ferrite has no in-band authentication).
    dhchap_key: Option<String>,
    /// DH-HMAC-CHAP controller key (SPDK's; Ferrite has no in-band authentication).
    dhchap_ctrlr_key: Option<String>,
}

impl Host {
    /// Refuses keys: a host given one expects TLS or authentication, which the target lacks.
    fn check_no_keys(&self) -> Result<(), RpcError> {
        if self.psk.is_some() {
            return Err(lacks("psk", "the target has no TLS"));
        }
        if self.dhchap_key.is_some() || self.dhchap_ctrlr_key.is_some() {
            return Err(lacks("dhchap_key", "the target has no DH-HMAC-CHAP authentication"));
        }
        Ok(())
    }
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RemoveHost {
    /// The subsystem's NQN.
    nqn: String,
    /// The host's NQN.
    host: String,
    /// SPDK's target name (Ferrite has one target; any value names it).
    #[allow(dead_code)]
    tgt_name: Option<String>,
    // SPDK bounds its wait for the host's connections to go; Ferrite answers once they are
    // closed on every reactor, which does not wait on the host.
    /// SPDK's (kept).
    #[allow(dead_code)]
    timeout_ms: Option<u64>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct AllowAny {
    /// The subsystem's NQN.
    nqn: String,
    /// Any host may connect.
    allow_any_host: bool,
    /// SPDK's target name (Ferrite has one target; any value names it).
    #[allow(dead_code)]
    tgt_name: Option<String>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct ReferralParams {
    /// The referred discovery service's address.
    address: ListenAddress,
    /// The referred subsystem (the discovery NQN if not given).
    subnqn: Option<String>,
    /// SPDK's TLS flag (Ferrite has no TLS: only false).
    #[serde(default)]
    secure_channel: bool,
    /// SPDK's target name (Ferrite has one target; any value names it).
    #[allow(dead_code)]
    tgt_name: Option<String>,
}

fn add_ns(a: AddNs) -> Result<Value, RpcError> {
    let n = &a.namespace;
    if n.no_auto_visible == Some(true) {
        return Err(lacks("no_auto_visible", "every host sees every namespace (no nvmf_ns_add_host)"));
    }
    let nguid = n.nguid.as_deref().map(hex_bytes::<16>).transpose()?.unwrap_or([0; 16]);
    let eui64 = n.eui64.as_deref().map(hex_bytes::<8>).transpose()?.unwrap_or([0; 8]);
    let mut uuid = n.uuid.as_deref().map(hex_bytes::<16>).transpose()?.unwrap_or([0; 16]);
    {
        let t = tables();
        let s = t.subsystem(&a.nqn).filter(|s| !s.discovery).ok_or_else(|| no_subsystem(&a.nqn))?;
        // A namespace's identity is its bdev's: two namespaces of one bdev would give hosts
        // duplicate identifiers (Linux refuses them; SPDK refuses the second add).
        let same = ferrite_bdev::lookup(&n.bdev_name).map(|b| b.id());
        if s.namespaces.values().any(|x| Some(x.bdev().id()) == same) {
            return Err(invalid(format!(
                "Invalid parameters: bdev {} is already a namespace of {}",
                n.bdev_name, a.nqn
            )));
        }
        if let Some(id) = n.nsid {
            if id == 0 || id > s.max_namespaces || s.namespaces.contains_key(&id) {
                return Err(invalid(format!("Invalid parameters: NSID {id} is in use or out of range")));
            }
        } else if s.free_nsid().is_none() {
            return Err(invalid("Invalid parameters: the subsystem has no free NSID"));
        }
    }
    let nqn = a.nqn.clone();
    // The bdev's own name, not the alias it was named by (as SPDK lists and saves it): an lvol
    // renamed later keeps it, so the saved config still finds the bdev.
    let bdev_name = ferrite_bdev::lookup(&n.bdev_name).map_or_else(|| n.bdev_name.clone(), |b| b.name().to_string());
    let notify_name = bdev_name.clone();
    let desc = ferrite_bdev::Bdev::open_ext(&n.bdev_name, true, move |ev| match ev {
        ferrite_bdev::BdevEvent::Remove => {
            // The bdev is going: so is its namespace (hosts are told).
            let nqn = nqn.clone();
            ferrite_reactor::engine().send(0, move || hot_remove(&nqn));
        }
        ferrite_bdev::BdevEvent::Resize | ferrite_bdev::BdevEvent::IoTypesChanged => {
            // Hosts are told its size or its write protection changed (SPDK's
            // spdk_nvmf_subsystem_ns_changed); Identify Namespace shows the new state.
            let (nqn, bdev_name) = (nqn.clone(), notify_name.clone());
            ferrite_reactor::engine().send(0, move || attributes_changed(&nqn, &bdev_name));
        }
        // SPDK's target has no notice for either: the namespace serves on.
        ferrite_bdev::BdevEvent::MediaManagement | ferrite_bdev::BdevEvent::Fault => {}
    })
    .map_err(|e| errno_error(libc::ENODEV, format!("Unable to add namespace: {e}")))?;
    // LBADS is a power of two: a namespace of 1536-byte blocks would show hosts 512-byte ones.
    let bs = desc.bdev().block_size();
    if !bs.is_power_of_two() {
        return Err(invalid(format!(
            "Invalid parameters: bdev {} has {bs}-byte blocks; a namespace's block size is a power of two",
            n.bdev_name
        )));
    }
    if uuid == [0; 16] {
        uuid = *desc.bdev().uuid().as_bytes();
    }
    if let Some(file) = &n.ptpl_file {
        // A file the target could never write would answer every reservation command with an
        // error: refused now, with its reason.
        let dir_ok = std::path::Path::new(file).parent().is_some_and(|d| d.as_os_str().is_empty() || d.is_dir());
        if file.is_empty() || file.ends_with('/') || !dir_ok {
            return Err(invalid(format!(
                "Invalid parameters: ptpl_file {file:?}: not a file path in an existing folder"
            )));
        }
        // The bdev's registry as it was when persisted (SPDK: nvmf_ns_reservation_restore).
        super::resv::restore(desc.bdev(), file).map_err(|e| invalid(format!("Invalid parameters: {e}")))?;
    }
    let mut t = tables();
    let s = t.subsystems.get_mut(&a.nqn).ok_or_else(|| no_subsystem(&a.nqn))?;
    let nsid = match n.nsid {
        Some(id) if !s.namespaces.contains_key(&id) => id,
        Some(id) => return Err(invalid(format!("Invalid parameters: NSID {id} is in use"))),
        None => s.free_nsid().ok_or_else(|| invalid("Invalid parameters: the subsystem has no free NSID"))?,
    };
    let anagrpid = n.anagrpid.unwrap_or(nsid);
    s.namespaces.insert(
        nsid,
        Arc::new(Namespace {
            nsid,
            bdev_name: bdev_name.clone(),
            desc,
            nguid,
            eui64,
            uuid,
            anagrpid,
            ptpl_file: n.ptpl_file.clone(),
        }),
    );
    s.shared.bump();
    admin::notify_ns_changed(s, nsid);
    admin::notify_ana_changed(s);
    log::info!("nvmf subsystem {}: namespace {nsid} is bdev {}", a.nqn, n.bdev_name);
    Ok(json!(nsid))
}

/// A namespace's bdev changed size or stopped taking writes: each namespace on it raises a
/// namespace attribute notice.
fn attributes_changed(nqn: &str, bdev_name: &str) {
    let t = tables();
    let Some(s) = t.subsystems.get(nqn) else { return };
    for n in s.namespaces.values().filter(|n| n.bdev_name == bdev_name) {
        let b = n.bdev();
        log::info!(
            "nvmf subsystem {nqn}: namespace {} changed: {} blocks, {}",
            n.nsid,
            b.num_blocks(),
            if b.supports(ferrite_bdev::IoType::Write) { "writable" } else { "write-protected" }
        );
        admin::notify_ns_changed(s, n.nsid);
    }
}

/// A namespace's bdev is being removed: remove every namespace on it.
fn hot_remove(nqn: &str) {
    let removed: Vec<Arc<Namespace>> = {
        let mut t = tables();
        let Some(s) = t.subsystems.get_mut(nqn) else { return };
        let gone: Vec<u32> = s.namespaces.values().filter(|n| n.bdev().is_removing()).map(|n| n.nsid).collect();
        let mut out = Vec::new();
        for id in gone {
            if let Some(n) = s.namespaces.remove(&id) {
                admin::notify_ns_changed(s, id);
                out.push(n);
            }
        }
        s.shared.bump();
        out
    };
    if removed.is_empty() {
        return;
    }
    for n in &removed {
        log::warn!("nvmf subsystem {nqn}: bdev {} removed; namespace {} removed", n.bdev_name, n.nsid);
    }
    ferrite_reactor::spawn_local(async move {
        let _ = ferrite_reactor::engine().on_all(|_| qpair::purge_namespaces_local()).await;
        drop(removed);
    })
    .detach();
}

fn listeners_json(s: &Subsystem) -> Value {
    Value::Array(
        s.listeners
            .iter()
            .map(|l| {
                let groups = s.ana_groups();
                json!({
                    "address": l.trid.to_json(),
                    "ana_states": groups.iter().map(|g| json!({"ana_group": g, "ana_state": l.ana_state(*g).name()})).collect::<Vec<_>>(),
                })
            })
            .collect(),
    )
}

/// Registers the methods and the "nvmf" subsystem.
pub fn register(reg: &mut Registry) {
    super::options::register(reg);
    let doc = MethodDoc::of::<TransportParams>("Creates the NVMe-oF transport (TCP).");
    reg.raw("nvmf_create_transport", RUNTIME, doc, |_, p: Params| async move { create_transport(p) });
    /// Params of `nvmf_get_transports`.
    #[derive(Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct NvmfGetTransports {
        /// Only this transport.
        trtype: Option<String>,
        /// SPDK's target name (Ferrite has one target; any value names it).
        #[allow(dead_code)]
        tgt_name: Option<String>,
    }
    reg.typed("nvmf_get_transports", "The NVMe-oF transports.", |_, a: NvmfGetTransports| async move {
        if a.trtype.as_deref().is_some_and(|t| !t.eq_ignore_ascii_case("tcp")) {
            return Err(invalid("Invalid parameters: transport not found"));
        }
        Ok(Value::Array(tables().transport.iter().map(transport_json).collect()))
    });
    reg.typed("nvmf_create_subsystem", "Creates an NVMe-oF subsystem.", |ctx, a: CreateSubsystem| async move {
        // nvmf_set_max_subsystems (an option method, kept by the registry) sets the limit.
        let max = ctx
            .registry
            .settings()
            .get("nvmf_set_max_subsystems", None)
            .and_then(|v| v["max_subsystems"].as_u64())
            // 0 is SPDK's default too (`spdk_nvmf_tgt_create`).
            .filter(|&n| n != 0)
            .unwrap_or(u64::from(model::DEFAULT_MAX_SUBSYSTEMS));
        create_subsystem(a, max as usize)
    });
    reg.typed(
        "nvmf_delete_subsystem",
        "Deletes an NVMe-oF subsystem (its controllers are disconnected).",
        |ctx, a: Nqn| async move {
            let (s, was) = {
                let mut t = tables();
                if a.nqn == nqn::DISCOVERY_NQN {
                    return Err(invalid("Invalid parameters: the discovery subsystem cannot be deleted"));
                }
                let was: Vec<Trid> = t.listen_addrs().into_iter().collect();
                let s = t.subsystems.remove(&a.nqn).ok_or_else(|| no_subsystem(&a.nqn))?;
                admin::notify_discovery_changed(&mut t);
                prune_listeners(&t, &was);
                (s, was)
            };
            let _ = was;
            for c in s.ctrlrs.values() {
                exec::destroy_ctrlr(c);
            }
            s.shared.bump();
            close_conns(&ctx, a.nqn.clone(), None).await;
            purge(&ctx).await;
            drop(s);
            log::info!("nvmf subsystem {} deleted", a.nqn);
            Ok(json!(true))
        },
    );
    reg.typed("nvmf_get_subsystems", "The NVMe-oF subsystems, or the one named.", |_, a: GetSubsystems| async move {
        let t = tables();
        if let Some(n) = &a.nqn {
            let s = t.subsystem(n).ok_or_else(|| no_subsystem(n))?;
            return Ok(json!([subsystem_json(s)]));
        }
        Ok(Value::Array(t.subsystems.values().map(subsystem_json).collect()))
    });
    reg.typed(
        "nvmf_subsystem_add_listener",
        "Adds a listener (address) to a subsystem.",
        |_, a: Listener| async move {
            a.check_plain()?;
            let trid = a.listen_address.trid()?;
            let state = a
                .ana_state
                .as_deref()
                .map(|s| AnaState::parse(s).ok_or_else(|| invalid(format!("Invalid parameters: ANA state {s}"))))
                .transpose()?;
            if tables().transport.is_none() {
                return Err(invalid("Invalid parameters: transport TCP not created (nvmf_create_transport)"));
            }
            {
                let t = tables();
                let s = t.subsystem(&a.nqn).ok_or_else(|| no_subsystem(&a.nqn))?;
                if s.listens_on(&trid) {
                    return Err(invalid("Invalid parameters: listener already exists"));
                }
            }
            super::listen::listen(&trid).map_err(|e| RpcError::internal(format!("Unable to add listener: {e}")))?;
            let mut t = tables();
            let Some(s) = t.subsystems.get_mut(&a.nqn) else {
                drop(t);
                let now = tables().listen_addrs();
                if !now.contains(&trid) {
                    super::listen::unlisten(&trid);
                }
                return Err(no_subsystem(&a.nqn));
            };
            let mut l = model::SubListener { trid: trid.clone(), ana: Default::default() };
            if state.is_some() && !s.ana_reporting {
                drop(t);
                return Err(invalid("Invalid parameters: ana_state needs a subsystem with ana_reporting"));
            }
            if let Some(st) = state {
                l.ana.insert(a.anagrpid.unwrap_or(1), st);
            }
            s.listeners.push(l);
            admin::notify_discovery_changed(&mut t);
            log::info!("nvmf subsystem {}: listening on {}", a.nqn, trid.socket_addr());
            Ok(json!(true))
        },
    );
    reg.typed(
        "nvmf_subsystem_remove_listener",
        "Removes a listener from a subsystem.",
        |ctx, a: Listener| async move {
            let trid = a.listen_address.trid()?;
            {
                let mut t = tables();
                let was: Vec<Trid> = t.listen_addrs().into_iter().collect();
                let s = t.subsystems.get_mut(&a.nqn).ok_or_else(|| no_subsystem(&a.nqn))?;
                let before = s.listeners.len();
                s.listeners.retain(|l| l.trid != trid);
                if s.listeners.len() == before {
                    return Err(invalid("Invalid parameters: no such listener"));
                }
                s.shared.bump();
                admin::notify_discovery_changed(&mut t);
                prune_listeners(&t, &was);
            }
            close_conns(&ctx, a.nqn.clone(), Some(trid)).await;
            Ok(json!(true))
        },
    );
    reg.typed(
        "nvmf_subsystem_listener_set_ana_state",
        "Sets the ANA state of a subsystem's listener.",
        |_, a: Listener| async move {
            let trid = a.listen_address.trid()?;
            let Some(state) = a.ana_state.as_deref() else {
                return Err(invalid("Invalid parameters: ana_state is required"));
            };
            let state =
                AnaState::parse(state).ok_or_else(|| invalid(format!("Invalid parameters: ANA state {state}")))?;
            let mut t = tables();
            let s = t.subsystems.get_mut(&a.nqn).ok_or_else(|| no_subsystem(&a.nqn))?;
            if !s.ana_reporting {
                // Hosts could not read the states (no ANA log, no ANA bit in CMIC), yet I/O would
                // fail with ANA statuses. SPDK answers the same.
                return Err(RpcError::internal("error setting ANA state: -22 (ANA reporting is disabled)"));
            }
            let groups: Vec<u32> = match a.anagrpid {
                Some(g) => vec![g],
                None => s.ana_groups().into_iter().chain(std::iter::once(1)).collect(),
            };
            let l = s
                .listeners
                .iter_mut()
                .find(|l| l.trid == trid)
                .ok_or_else(|| invalid("Invalid parameters: no such listener"))?;
            for g in groups {
                l.ana.insert(g, state);
            }
            s.shared.bump();
            admin::notify_ana_changed(s);
            Ok(json!(true))
        },
    );
    reg.typed("nvmf_subsystem_get_listeners", "The listeners of a subsystem.", |_, a: Nqn| async move {
        let t = tables();
        let s = t.subsystem(&a.nqn).ok_or_else(|| no_subsystem(&a.nqn))?;
        Ok(listeners_json(s))
    });
    reg.typed("nvmf_subsystem_add_ns", "Adds a namespace over a bdev to a subsystem.", |_, a: AddNs| async move {
        add_ns(a)
    });
    reg.typed("nvmf_subsystem_remove_ns", "Removes a namespace from a subsystem.", |ctx, a: RemoveNs| async move {
        let ns = {
            let mut t = tables();
            let s = t.subsystems.get_mut(&a.nqn).ok_or_else(|| no_subsystem(&a.nqn))?;
            let ns = s
                .namespaces
                .remove(&a.nsid)
                .ok_or_else(|| invalid(format!("Invalid parameters: no namespace {}", a.nsid)))?;
            s.shared.bump();
            admin::notify_ns_changed(s, a.nsid);
            admin::notify_ana_changed(s);
            ns
        };
        purge(&ctx).await;
        log::info!("nvmf subsystem {}: namespace {} (bdev {}) removed", a.nqn, a.nsid, ns.bdev_name);
        drop(ns);
        Ok(json!(true))
    });
    reg.typed("nvmf_subsystem_add_host", "Allows a host NQN to connect to a subsystem.", |_, a: Host| async move {
        a.check_no_keys()?;
        nqn::validate(&a.host).map_err(|e| invalid(format!("Invalid parameters: host NQN {}: {e}", a.host)))?;
        let mut t = tables();
        let s = t.subsystems.get_mut(&a.nqn).filter(|s| !s.discovery).ok_or_else(|| no_subsystem(&a.nqn))?;
        s.hosts.insert(a.host);
        admin::notify_discovery_changed(&mut t);
        Ok(json!(true))
    });
    reg.typed(
        "nvmf_subsystem_remove_host",
        "Removes a host NQN from a subsystem (its controllers are disconnected).",
        |ctx, a: RemoveHost| async move {
            let gone: Vec<Arc<Ctrlr>> = {
                let mut t = tables();
                let s = t.subsystems.get_mut(&a.nqn).ok_or_else(|| no_subsystem(&a.nqn))?;
                if !s.hosts.remove(&a.host) {
                    return Err(invalid(format!("Invalid parameters: host {} not found", a.host)));
                }
                let gone = s.ctrlrs.values().filter(|c| c.hostnqn == a.host).cloned().collect();
                admin::notify_discovery_changed(&mut t);
                gone
            };
            // Its controllers go (SPDK disconnects the host too), as any controller ends: out of
            // the subsystem (their controller IDs free again), then their queue pairs close.
            for c in &gone {
                exec::destroy_ctrlr(c);
            }
            let (nqn, host) = (a.nqn.clone(), a.host.clone());
            let _ = ctx
                .engine
                .on_all(move |_| {
                    qpair::close_local(&|c: &qpair::Conn| {
                        c.ctrl().is_some_and(|x| x.subnqn == nqn && x.hostnqn == host)
                    })
                })
                .await;
            Ok(json!(true))
        },
    );
    reg.typed(
        "nvmf_subsystem_allow_any_host",
        "Lets any host connect to a subsystem, or only those added.",
        |_, a: AllowAny| async move {
            let mut t = tables();
            let s = t.subsystems.get_mut(&a.nqn).filter(|s| !s.discovery).ok_or_else(|| no_subsystem(&a.nqn))?;
            s.allow_any_host = a.allow_any_host;
            admin::notify_discovery_changed(&mut t);
            Ok(json!(true))
        },
    );
    reg.typed("nvmf_subsystem_get_controllers", "The controllers of a subsystem.", |_, a: Nqn| async move {
        let t = tables();
        let s = t.subsystem(&a.nqn).ok_or_else(|| no_subsystem(&a.nqn))?;
        Ok(Value::Array(
            s.ctrlrs
                .values()
                .map(|c| {
                    // `io_stats` is Ferrite's: the I/O commands the controller has run (SPDK
                    // shows none here), which tells which path a multipath host uses.
                    let (reads, writes, bytes_read, bytes_written) = c.totals();
                    json!({"cntlid": c.cntlid, "hostnqn": c.hostnqn, "hostid": uuid_string(&c.hostid),
                        "num_io_qpairs": c.io_qpairs.load(std::sync::atomic::Ordering::Relaxed),
                        "io_stats": {"read_ops": reads, "write_ops": writes, "bytes_read": bytes_read,
                            "bytes_written": bytes_written}})
                })
                .collect(),
        ))
    });
    reg.typed("nvmf_subsystem_get_qpairs", "The queue pairs of a subsystem.", |ctx, a: Nqn| async move {
        if tables().subsystem(&a.nqn).is_none() {
            return Err(no_subsystem(&a.nqn));
        }
        let all = ctx.engine.on_all(|_| qpair::local_qpairs()).await.unwrap_or_default();
        Ok(Value::Array(
            all.into_iter()
                .flatten()
                .filter(|q| q.subnqn == a.nqn)
                .map(|q| {
                    json!({"cntlid": q.cntlid, "qid": q.qid, "state": "active", "thread": format!("nvmf_tgt_poll_group_{:03}", q.reactor),
                        "listen_address": q.trid.to_json(), "peer_address": {"trtype": "TCP", "traddr": q.peer}})
                })
                .collect(),
        ))
    });
    reg.typed("nvmf_get_stats", "Per-reactor statistics of the NVMe-oF target.", |ctx, _: TgtOnly| async move {
        let all = ctx.engine.on_all(|_| qpair::local_qpairs()).await.unwrap_or_default();
        let groups: Vec<Value> = all
            .iter()
            .enumerate()
            .map(|(i, qs)| {
                let admin = qs.iter().filter(|q| q.qid == 0).count();
                json!({"name": format!("nvmf_tgt_poll_group_{i:03}"), "current_admin_qpairs": admin,
                    "current_io_qpairs": qs.len() - admin, "transports": [{"trtype": "TCP"}]})
            })
            .collect();
        Ok(json!({"tick_rate": 1_000_000_000u64, "poll_groups": groups}))
    });
    reg.typed(
        "nvmf_discovery_add_referral",
        "Adds a referral to the discovery log page.",
        |_, a: ReferralParams| async move {
            let trid = a.address.trid()?;
            let subnqn = a.subnqn.unwrap_or_else(|| nqn::DISCOVERY_NQN.into());
            nqn::validate(&subnqn).map_err(|e| invalid(format!("Invalid parameters: {e}")))?;
            let mut t = tables();
            if t.referrals.iter().any(|r| r.trid == trid && r.subnqn == subnqn) {
                return Err(errno_error(libc::EEXIST, "Referral already exists"));
            }
            t.referrals.push(Referral { trid, subnqn, secure_channel: a.secure_channel });
            admin::notify_discovery_changed(&mut t);
            Ok(json!(true))
        },
    );
    reg.typed(
        "nvmf_discovery_remove_referral",
        "Removes a referral from the discovery log page.",
        |_, a: ReferralParams| async move {
            let trid = a.address.trid()?;
            let mut t = tables();
            let before = t.referrals.len();
            t.referrals.retain(|r| !(r.trid == trid && a.subnqn.as_ref().is_none_or(|n| &r.subnqn == n)));
            if t.referrals.len() == before {
                return Err(errno_error(libc::ENOENT, "Referral not found"));
            }
            admin::notify_discovery_changed(&mut t);
            Ok(json!(true))
        },
    );
    reg.typed("nvmf_discovery_get_referrals", "The referrals of the discovery log page.", |_, _: TgtOnly| async move {
        let t = tables();
        Ok(Value::Array(
            t.referrals
                .iter()
                .map(|r| json!({"address": r.trid.to_json(), "secure_channel": r.secure_channel, "subnqn": r.subnqn}))
                .collect(),
        ))
    });
    reg.subsystem(ferrite_rpc::Subsystem { name: "nvmf", depends_on: vec!["bdev"], config: Arc::new(config) });
}

/// The "nvmf" subsystem's config entries, in replay order (SPDK's order).
fn config() -> Vec<Value> {
    let t = tables();
    let mut v = Vec::new();
    if let Some(o) = &t.transport {
        v.push(json!({"method": "nvmf_create_transport", "params": transport_json(o)}));
    }
    for r in &t.referrals {
        v.push(json!({"method": "nvmf_discovery_add_referral",
            "params": {"address": r.trid.to_json(), "subnqn": r.subnqn, "secure_channel": r.secure_channel}}));
    }
    for s in t.subsystems.values() {
        if !s.discovery {
            let mut params = json!({"nqn": s.nqn, "allow_any_host": s.allow_any_host, "serial_number": s.serial,
                "model_number": s.model, "min_cntlid": s.min_cntlid, "max_cntlid": s.max_cntlid,
                "ana_reporting": s.ana_reporting});
            if s.max_namespaces_given != 0 {
                params["max_namespaces"] = json!(s.max_namespaces_given);
            }
            v.push(json!({"method": "nvmf_create_subsystem", "params": params}));
            for h in &s.hosts {
                v.push(json!({"method": "nvmf_subsystem_add_host", "params": {"nqn": s.nqn, "host": h}}));
            }
            for n in s.namespaces.values() {
                let mut ns = json!({"nsid": n.nsid, "bdev_name": n.bdev_name, "uuid": uuid_string(&n.uuid)});
                if n.nguid != [0; 16] {
                    ns["nguid"] = json!(hex_string(&n.nguid));
                }
                if n.eui64 != [0; 8] {
                    ns["eui64"] = json!(hex_string(&n.eui64));
                }
                if s.ana_reporting || n.anagrpid != n.nsid {
                    ns["anagrpid"] = json!(n.anagrpid);
                }
                if let Some(f) = &n.ptpl_file {
                    ns["ptpl_file"] = json!(f);
                }
                v.push(json!({"method": "nvmf_subsystem_add_ns", "params": {"nqn": s.nqn, "namespace": ns}}));
            }
        }
        for l in &s.listeners {
            let mut params = json!({"nqn": s.nqn, "listen_address": l.trid.to_json()});
            params["secure_channel"] = json!(false);
            v.push(json!({"method": "nvmf_subsystem_add_listener", "params": params}));
            for (g, st) in &l.ana {
                if *st != AnaState::Optimized {
                    v.push(json!({"method": "nvmf_subsystem_listener_set_ana_state",
                        "params": {"nqn": s.nqn, "listen_address": l.trid.to_json(), "ana_state": st.name(), "anagrpid": g}}));
                }
            }
        }
    }
    v
}

/// Stops every listener and closes every connection (daemon shutdown; on the first reactor).
pub async fn shutdown(engine: &ferrite_reactor::Engine) {
    super::listen::unlisten_all();
    let _ = engine.on_all(|_| qpair::close_local(&|_| true)).await;
    // Namespaces close their bdevs now, so that the bdevs can be deleted.
    let mut t = tables();
    for s in t.subsystems.values_mut() {
        s.namespaces.clear();
        s.ctrlrs.clear();
    }
}

/// A port given as a string (SPDK's type) or, from `ferrite rpc --trsvcid 4420`, as a number.
fn port_text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    match Option::<serde_json::Value>::deserialize(d)? {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(s)),
        Some(serde_json::Value::Number(n)) => Ok(Some(n.to_string())),
        Some(other) => Err(serde::de::Error::custom(format!("trsvcid must be a string, not {other}"))),
    }
}
