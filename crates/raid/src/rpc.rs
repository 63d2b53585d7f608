//! SPDK's RAID methods (module/bdev/raid/bdev_raid_rpc.c, v26.05): `bdev_raid_create`,
//! `bdev_raid_delete`, `bdev_raid_get_bdevs`, `bdev_raid_add_base_bdev`,
//! `bdev_raid_remove_base_bdev` (and the option method `bdev_raid_set_options`, in
//! `options`), with SPDK's parameters, error codes and messages.

use crate::level::Level;
use crate::raid::{self, CreateOpts, State};
use ferrite_bdev::BdevError;
use ferrite_rpc::jsonrpc::{INTERNAL_ERROR, PARSE_ERROR};
use ferrite_rpc::registry::RUNTIME;
use ferrite_rpc::{errno_error, Params, Registry, RpcError};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

/// Decodes params as SPDK's `spdk_json_decode_object` does: unknown members, missing required
/// ones and wrong types fail with `code` ("spdk_json_decode_object failed").
/// Decodes params as SPDK's RAID handlers do, failing with -32700 (most of them).
fn decode<T: DeserializeOwned>(_: &'static str, p: Params) -> Result<T, RpcError> {
    decode_as(p, PARSE_ERROR)
}

/// Decodes params as `bdev_raid_add_base_bdev` does, failing with -32603.
fn decode_internal<T: DeserializeOwned>(_: &'static str, p: Params) -> Result<T, RpcError> {
    decode_as(p, INTERNAL_ERROR)
}

/// Decodes params as SPDK's `spdk_json_decode_object` failing with `code`.
fn decode_as<T: DeserializeOwned>(p: Params, code: i32) -> Result<T, RpcError> {
    p.parse().map_err(|e: RpcError| {
        let why = e.message.strip_prefix("Invalid parameters: ").unwrap_or(&e.message).to_string();
        RpcError::new(code, format!("spdk_json_decode_object failed: {why}"))
    })
}

fn strerror(e: &BdevError) -> String {
    e.to_string()
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Create {
    /// Name of the RAID bdev.
    #[schemars(example = &"Raid0")]
    name: String,
    /// `raid0`, `raid1`, `raid5f` or `concat` (also `0`, `1`, ...).
    #[schemars(example = &"raid1")]
    raid_level: String,
    /// The base bdevs: a list, or names separated by spaces.
    #[schemars(example = two_bases())]
    base_bdevs: BaseBdevs,
    /// Strip size in KiB (not for raid1).
    strip_size_kb: Option<u32>,
    /// The UUID to give (random if not given).
    uuid: Option<String>,
    /// Write SPDK's superblock to the base bdevs (examine reassembles the RAID).
    superblock: Option<bool>,
}

/// `base_bdevs`: a list of names (SPDK's rpc.py), or one string of names separated by blanks.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(untagged)]
enum BaseBdevs {
    List(Vec<String>),
    Words(String),
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Delete {
    /// The RAID bdev.
    name: String,
    /// Clear the superblock on the base bdevs.
    clear_sb: Option<bool>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct GetBdevs {
    /// `all`, `online`, `configuring` or `offline`.
    category: String,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct AddBase {
    /// The base bdev to add.
    base_bdev: String,
    /// The RAID bdev.
    raid_bdev: String,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RemoveBase {
    /// The base bdev.
    name: String,
}

/// Registers the RAID methods and the option method.
pub fn register(reg: &mut Registry) {
    crate::options::register(reg);
    reg.typed_with(
        "bdev_raid_create",
        RUNTIME,
        "Creates a RAID bdev (raid0, raid1, raid5f or concat) over base bdevs.",
        decode,
        |ctx, c: Create| async move {
            crate::options::note(&ctx.registry);
            let level = Level::parse(&c.raid_level).ok_or_else(|| {
                RpcError::new(
                    PARSE_ERROR,
                    format!("spdk_json_decode_object failed: unknown raid_level {:?}", c.raid_level),
                )
            })?;
            let base_bdevs = match c.base_bdevs {
                BaseBdevs::List(v) => v,
                BaseBdevs::Words(s) => s.split_whitespace().map(str::to_string).collect(),
            };
            let uuid = match c.uuid.as_deref() {
                None => None,
                Some(s) => Some(uuid::Uuid::parse_str(s).map_err(|e| {
                    RpcError::new(PARSE_ERROR, format!("spdk_json_decode_object failed: uuid {s:?}: {e}"))
                })?),
            };
            let name = c.name.clone();
            raid::create(CreateOpts {
                name: c.name,
                level,
                base_bdevs,
                strip_size_kb: c.strip_size_kb.unwrap_or(0),
                uuid,
                superblock: c.superblock.unwrap_or(false),
            })
            .await
            .map_err(|e| errno_error(e.errno(), format!("Failed to create RAID bdev {name}: {}", strerror(&e))))?;
            Ok(json!(true))
        },
    );
    reg.typed_with("bdev_raid_delete", RUNTIME, "Deletes a RAID bdev.", decode, |_, d: Delete| async move {
        if raid::find(&d.name).is_none() {
            return Err(errno_error(libc::ENODEV, format!("raid bdev {} not found", d.name)));
        }
        raid::delete(&d.name, d.clear_sb.unwrap_or(false))
            .await
            .map_err(|e| RpcError::new(INTERNAL_ERROR, strerror(&e)))?;
        Ok(json!(true))
    });
    reg.typed_with(
        "bdev_raid_get_bdevs",
        RUNTIME,
        "The RAID bdevs in one category (all, online, configuring, offline).",
        decode,
        |ctx, g: GetBdevs| async move {
            crate::options::note(&ctx.registry);
            let want = match g.category.as_str() {
                "all" => None,
                "online" => Some(State::Online),
                "configuring" => Some(State::Configuring),
                "offline" => Some(State::Offline),
                other => {
                    return Err(RpcError::new(
                        PARSE_ERROR,
                        format!("spdk_json_decode_object failed: unknown category {other:?}"),
                    ))
                }
            };
            let list: Vec<Value> =
                raid::all().into_iter().filter(|r| want.is_none_or(|w| r.state() == w)).map(|r| r.info()).collect();
            Ok(Value::Array(list))
        },
    );
    reg.typed_with(
        "bdev_raid_add_base_bdev",
        RUNTIME,
        "Adds a base bdev to a RAID bdev (a raid1 member is rebuilt into it).",
        decode_internal,
        |ctx, a: AddBase| async move {
            crate::options::note(&ctx.registry);
            if raid::find(&a.raid_bdev).is_none() {
                return Err(errno_error(libc::ENODEV, format!("raid bdev {} is not found in config", a.raid_bdev)));
            }
            raid::add_base_bdev(&a.raid_bdev, &a.base_bdev, crate::options::current()).await.map_err(|e| {
                errno_error(
                    e.errno(),
                    format!("Failed to add base bdev {} to RAID bdev {}: {}", a.base_bdev, a.raid_bdev, strerror(&e)),
                )
            })?;
            Ok(json!(true))
        },
    );
    reg.typed_with(
        "bdev_raid_remove_base_bdev",
        RUNTIME,
        "Removes a base bdev from its RAID bdev.",
        decode,
        |_, r: RemoveBase| async move {
            if ferrite_bdev::lookup(&r.name).is_none() {
                return Err(errno_error(libc::ENODEV, "Failed to remove base bdev from raid bdev"));
            }
            raid::remove_base_bdev(&r.name).await.map_err(|e| {
                errno_error(e.errno(), format!("Failed to remove base bdev from raid bdev: {}", strerror(&e)))
            })?;
            Ok(json!(true))
        },
    );
}

/// The example of a RAID's base bdevs.
fn two_bases() -> [&'static str; 2] {
    ["Malloc0", "Malloc1"]
}
