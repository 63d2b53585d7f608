//! SPDK's lvol methods: bdev_lvol_create_lvstore, bdev_lvol_get_lvstores,
//! bdev_lvol_delete_lvstore, bdev_lvol_rename_lvstore, bdev_lvol_grow_lvstore, bdev_lvol_create, bdev_lvol_get_lvols,
//! bdev_lvol_delete, bdev_lvol_resize, bdev_lvol_snapshot, bdev_lvol_clone, bdev_lvol_clone_bdev,
//! bdev_lvol_inflate,
//! bdev_lvol_decouple_parent, bdev_lvol_set_parent, bdev_lvol_set_read_only, bdev_lvol_rename. Parameters, results
//! and errnos as SPDK's.

use crate::lvs::{self, LvolError, LvsOpts, Lvstore};
use ferrite_blob::format::blob::ClearMethod;
use ferrite_blob::store::InitClear;
use ferrite_rpc::{errno_error, Registry, RpcError};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

/// A failure SPDK's RPC finds before the operation starts: the negative errno as code.
fn err(e: LvolError) -> RpcError {
    errno_error(e.errno, e.message)
}

/// A failure of the operation itself: SPDK's RPCs answer these from the completion with
/// -32602 (INVALID_PARAMS) and the strerror text. Ferrite keeps its own message, which names
/// what failed, and SPDK's code, which clients branch on. See docs/ARCHITECTURE.md.
fn failed(e: LvolError) -> RpcError {
    RpcError::invalid_params(e.message)
}

/// `bdev_lvol_create_lvstore`: the checks of names, sizes and the base bdev answer their
/// errno; a failure to make the blobstore answers as [`failed`].
fn lvstore_err(e: LvolError) -> RpcError {
    if e.late {
        failed(e)
    } else {
        err(e)
    }
}

/// `bdev_lvol_create`: a name taken (EEXIST), an lvstore gone (ENODEV) or a bad parameter
/// (EINVAL) answer their errno, as SPDK checks them first; the rest (ENOSPC) as [`failed`].
fn create_err(e: LvolError) -> RpcError {
    match e.errno {
        libc::EEXIST | libc::ENODEV | libc::EINVAL if !e.late => err(e),
        _ => failed(e),
    }
}

fn einval(msg: impl Into<String>) -> RpcError {
    errno_error(libc::EINVAL, msg)
}

/// The lvstore named by exactly one of `uuid` and `lvs_name` (SPDK's rule).
fn pick_lvs(uuid: Option<&str>, name: Option<&str>) -> Result<Arc<Lvstore>, RpcError> {
    match (uuid, name) {
        (Some(_), Some(_)) | (None, None) => Err(einval("Invalid parameters: give one of uuid and lvs_name")),
        (Some(u), None) => lvs::by_uuid(u).ok_or_else(|| errno_error(libc::ENODEV, "No such device")),
        (None, Some(n)) => lvs::by_name(n).ok_or_else(|| errno_error(libc::ENODEV, "No such device")),
    }
}

/// An lvstore named by `uuid` or `lvs_name` (see [`pick_lvs`]).
#[derive(Deserialize, Default, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct LvsRef {
    /// The lvstore's UUID (or give `lvs_name`).
    uuid: Option<String>,
    /// The lvstore's name (or give `uuid`).
    lvs_name: Option<String>,
}

/// An lvol (or lvstore) named by `name`.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Named {
    /// The lvol: its bdev name, alias (`lvs/lvol`) or UUID.
    name: String,
}

/// A rename.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Rename {
    /// Its name now.
    old_name: String,
    /// Its new name.
    new_name: String,
}

fn lvs_json(l: &Lvstore) -> Value {
    let g = l.bs.geometry();
    json!({
        "uuid": l.uuid.to_string(),
        "name": *l.name.lock().unwrap(),
        "base_bdev": l.base,
        "total_data_clusters": l.bs.data_clusters(),
        "free_clusters": l.bs.free_clusters(),
        "block_size": g.io_unit_size,
        "cluster_size": g.cluster_size,
        "max_growable_size": l.bs.max_growable_size(),
        // Ferrite's own: released clusters that are not free yet (in-flight I/O draining).
        "draining_clusters": l.bs.draining_clusters(),
    })
}

fn lvol_json(l: &Lvstore, v: &lvs::Lvol) -> Value {
    let lvs_name = l.name.lock().unwrap().clone();
    let name = v.name.lock().unwrap().clone();
    json!({
        "alias": format!("{lvs_name}/{name}"),
        "uuid": v.uuid.to_string(),
        "name": name,
        "is_thin_provisioned": v.blob.is_thin(),
        "is_snapshot": !l.bs.clones_of(v.blob.id()).is_empty(),
        "is_clone": v.blob.parent_id().is_some(),
        "is_esnap_clone": v.blob.external_id().is_some(),
        "is_degraded": l.degraded.lock().unwrap().iter().any(|d| d.uuid == v.uuid),
        "num_allocated_clusters": v.blob.allocated_clusters(),
        "lvs": {"name": lvs_name, "uuid": l.uuid.to_string()},
    })
}

fn clear_method(s: Option<&str>) -> Result<Option<ClearMethod>, RpcError> {
    Ok(match s {
        None => None,
        Some("none") => Some(ClearMethod::None),
        Some("unmap") => Some(ClearMethod::Unmap),
        Some("write_zeroes") => Some(ClearMethod::WriteZeroes),
        Some(o) => return Err(einval(format!("Invalid parameters: clear_method {o:?} (none, unmap, write_zeroes)"))),
    })
}

/// Registers the methods.
pub fn register(reg: &mut Registry) {
    register_family(reg);
    /// Params of `bdev_lvol_create_lvstore`.
    #[derive(Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct BdevLvolCreateLvstore {
        /// The base bdev.
        #[schemars(example = &"Malloc0")]
        bdev_name: String,
        /// The lvstore's name.
        #[schemars(example = &"lvs0")]
        lvs_name: String,
        /// Cluster size in bytes (0 or not given: 4 MiB).
        cluster_sz: Option<u32>,
        /// How space is cleared: `none`, `unmap` or `write_zeroes`.
        clear_method: Option<String>,
        /// Metadata pages reserved per cluster.
        num_md_pages_per_cluster_ratio: Option<u32>,
        /// Metadata page size: only 4096.
        md_page_size: Option<u32>,
    }
    reg.typed(
        "bdev_lvol_create_lvstore",
        "Creates an lvstore (blobstore) on a bdev.",
        |_, a: BdevLvolCreateLvstore| async move {
            if a.md_page_size.is_some_and(|s| s != 0 && s != 4096) {
                return Err(einval("Invalid parameters: only md_page_size 4096 is supported"));
            }
            let clear = match a.clear_method.as_deref() {
                None | Some("unmap") => InitClear::Unmap,
                Some("write_zeroes") => InitClear::WriteZeroes,
                Some("none") => InitClear::None,
                Some(o) => return Err(einval(format!("Invalid parameters: clear_method {o:?}"))),
            };
            let o = LvsOpts {
                bdev_name: a.bdev_name,
                lvs_name: a.lvs_name,
                cluster_sz: a.cluster_sz.filter(|&c| c != 0),
                clear,
                md_pages_per_cluster_ratio: a.num_md_pages_per_cluster_ratio,
            };
            let l = lvs::create(&o).await.map_err(lvstore_err)?;
            Ok(json!(l.uuid.to_string()))
        },
    );
    reg.typed(
        "bdev_lvol_get_lvstores",
        "Every lvstore, or the one named by UUID or name.",
        |_, a: LvsRef| async move {
            if a.uuid.is_some() || a.lvs_name.is_some() {
                let l = pick_lvs(a.uuid.as_deref(), a.lvs_name.as_deref())?;
                return Ok(json!([lvs_json(&l)]));
            }
            Ok(Value::Array(lvs::all().iter().map(|l| lvs_json(l)).collect()))
        },
    );
    reg.typed("bdev_lvol_delete_lvstore", "Deletes an lvstore and its lvols.", |_, a: LvsRef| async move {
        let l = pick_lvs(a.uuid.as_deref(), a.lvs_name.as_deref())?;
        lvs::delete(&l).await.map_err(failed)?;
        Ok(json!(true))
    });
    /// Params of `bdev_lvol_create`.
    #[derive(Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct BdevLvolCreate {
        /// The lvol's name.
        #[schemars(example = &"lvol0")]
        lvol_name: String,
        /// Size in MiB (give this or `size`).
        #[schemars(example = 64)]
        size_in_mib: Option<u64>,
        /// Size in bytes (give this or `size_in_mib`).
        size: Option<u64>,
        /// Allocate clusters on first write.
        thin_provision: Option<bool>,
        /// The lvstore's UUID (or give `lvs_name`).
        uuid: Option<String>,
        /// The lvstore's name (or give `uuid`).
        #[schemars(example = &"lvs0")]
        lvs_name: Option<String>,
        /// How space is cleared: `none`, `unmap` or `write_zeroes`.
        clear_method: Option<String>,
    }
    reg.typed("bdev_lvol_create", "Creates an lvol in an lvstore.", |_, a: BdevLvolCreate| async move {
        let size = match (a.size_in_mib, a.size) {
            (Some(m), None) => m.checked_mul(1 << 20).ok_or_else(|| einval("Invalid parameters: size too large"))?,
            (None, Some(b)) => b,
            _ => return Err(einval("Invalid parameters: give one of size_in_mib and size")),
        };
        let l = pick_lvs(a.uuid.as_deref(), a.lvs_name.as_deref())?;
        let clear = clear_method(a.clear_method.as_deref())?;
        let v = lvs::create_lvol(&l, &a.lvol_name, size, a.thin_provision.unwrap_or(false), clear)
            .await
            .map_err(create_err)?;
        Ok(json!(v.bdev_name()))
    });
    /// Params of `bdev_lvol_get_lvols`.
    #[derive(Deserialize, Default, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct BdevLvolGetLvols {
        /// Only this lvstore (by UUID).
        lvs_uuid: Option<String>,
        /// Only this lvstore (by name).
        lvs_name: Option<String>,
    }
    reg.typed("bdev_lvol_get_lvols", "The lvols, of every lvstore or of one.", |_, a: BdevLvolGetLvols| async move {
        let stores = if a.lvs_uuid.is_some() || a.lvs_name.is_some() {
            vec![pick_lvs(a.lvs_uuid.as_deref(), a.lvs_name.as_deref())?]
        } else {
            lvs::all()
        };
        let mut out = Vec::new();
        for l in &stores {
            let mut all: Vec<Arc<lvs::Lvol>> = l.lvols.lock().unwrap().values().cloned().collect();
            all.extend(l.degraded.lock().unwrap().iter().cloned());
            for v in &all {
                out.push(lvol_json(l, v));
            }
        }
        Ok(Value::Array(out))
    });
    reg.typed("bdev_lvol_delete", "Deletes an lvol.", |_, a: Named| async move {
        // A degraded lvol has no bdev: SPDK finds it by UUID or lvs_name/lvol_name.
        let (l, v) = lvs::lvol(&a.name)
            .or_else(|| lvs::degraded_lvol(&a.name))
            .ok_or_else(|| errno_error(libc::ENODEV, "No such device"))?;
        // SPDK's bdev_lvol_delete answers its completion's failure with -32603.
        lvs::delete_lvol(&l, v).await.map_err(|e| RpcError::internal(e.message))?;
        Ok(json!(true))
    });
    /// Params of `bdev_lvol_resize`.
    #[derive(Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct BdevLvolResize {
        /// The lvol.
        name: String,
        /// Size in MiB (give this or `size`).
        size_in_mib: Option<u64>,
        /// Size in bytes (give this or `size_in_mib`).
        size: Option<u64>,
    }
    reg.typed("bdev_lvol_resize", "Resizes an lvol.", |_, a: BdevLvolResize| async move {
        let size = match (a.size_in_mib, a.size) {
            (Some(m), None) => m.checked_mul(1 << 20).ok_or_else(|| einval("Invalid parameters: size too large"))?,
            (None, Some(b)) => b,
            _ => return Err(einval("Invalid parameters: give one of size_in_mib and size")),
        };
        let (l, v) = lvs::lvol(&a.name).ok_or_else(|| errno_error(libc::ENODEV, "No such device"))?;
        if size == 0 {
            // SPDK makes the bdev 0 blocks long; Ferrite refuses (see docs/ARCHITECTURE.md).
            return Err(einval("an lvol cannot be resized to 0 bytes: it would have no block to serve"));
        }
        lvs::resize_lvol(&l, &v, size).await.map_err(failed)?;
        Ok(json!(true))
    });
}

fn lvol_by_name(name: &str) -> Result<(Arc<Lvstore>, Arc<lvs::Lvol>), RpcError> {
    lvs::lvol(name).ok_or_else(|| errno_error(libc::ENODEV, "No such device"))
}

/// Registers the snapshot, clone and rename methods.
fn register_family(reg: &mut Registry) {
    /// Params of `bdev_lvol_snapshot`.
    #[derive(Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct BdevLvolSnapshot {
        /// The lvol.
        lvol_name: String,
        /// The snapshot's name.
        snapshot_name: String,
    }
    reg.typed(
        "bdev_lvol_snapshot",
        "Makes a read-only snapshot of an lvol (the lvol becomes its clone).",
        |_, a: BdevLvolSnapshot| async move {
            let (l, v) = lvol_by_name(&a.lvol_name)?;
            let s = lvs::snapshot_lvol(&l, &v, &a.snapshot_name).await.map_err(failed)?;
            Ok(json!(s.bdev_name()))
        },
    );
    /// Params of `bdev_lvol_clone_bdev`.
    #[derive(Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct BdevLvolCloneBdev {
        /// The read-only bdev to clone (outside the lvstore).
        bdev: String,
        /// The lvstore of the clone.
        lvs_name: String,
        /// The clone's name.
        clone_name: String,
    }
    reg.typed(
        "bdev_lvol_clone_bdev",
        "Makes an lvol that is a clone of a read-only bdev outside the lvstore.",
        |_, a: BdevLvolCloneBdev| async move {
            let l = lvs::by_name(&a.lvs_name).ok_or_else(|| errno_error(libc::ENODEV, "No such device"))?;
            let c = lvs::clone_bdev(&l, &a.bdev, &a.clone_name).await.map_err(failed)?;
            Ok(json!(c.bdev_name()))
        },
    );
    /// Params of `bdev_lvol_clone`.
    #[derive(Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct BdevLvolClone {
        /// The snapshot.
        snapshot_name: String,
        /// The clone's name.
        clone_name: String,
    }
    reg.typed("bdev_lvol_clone", "Makes a writable clone of a snapshot.", |_, a: BdevLvolClone| async move {
        let (l, v) = lvol_by_name(&a.snapshot_name)?;
        let c = lvs::clone_lvol(&l, &v, &a.clone_name).await.map_err(failed)?;
        Ok(json!(c.bdev_name()))
    });
    let separate = [
        ("bdev_lvol_inflate", true, "Allocates every cluster of an lvol, copying from its parent, and detaches it."),
        (
            "bdev_lvol_decouple_parent",
            false,
            "Copies the clusters an lvol takes from its parent and makes the parent's parent its own.",
        ),
    ];
    for (method, all, summary) in separate {
        reg.typed(method, summary, move |_, a: Named| async move {
            let (l, v) = lvol_by_name(&a.name)?;
            lvs::separate_lvol(&l, &v, all).await.map_err(failed)?;
            Ok(json!(true))
        });
    }
    /// Params of `bdev_lvol_set_parent`.
    #[derive(Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct BdevLvolSetParent {
        /// The thin lvol.
        lvol_name: String,
        /// The snapshot to make its parent.
        parent_name: String,
    }
    reg.typed(
        "bdev_lvol_set_parent",
        "Makes a snapshot the parent of a thin lvol.",
        |_, a: BdevLvolSetParent| async move {
            let (l, v) = lvol_by_name(&a.lvol_name)?;
            let (pl, pv) = lvol_by_name(&a.parent_name)?;
            if !Arc::ptr_eq(&l, &pl) {
                return Err(einval("Invalid parameters: the parent is in another lvstore"));
            }
            lvs::set_parent(&l, &v, &pv).await.map_err(failed)?;
            Ok(json!(true))
        },
    );
    reg.typed("bdev_lvol_set_read_only", "Makes an lvol read-only.", |_, a: Named| async move {
        let (_, v) = lvol_by_name(&a.name)?;
        lvs::set_read_only(&v).await.map_err(failed)?;
        Ok(json!(true))
    });
    reg.typed("bdev_lvol_rename", "Renames an lvol.", |_, a: Rename| async move {
        let (l, v) = lvol_by_name(&a.old_name)?;
        lvs::rename_lvol(&l, &v, &a.new_name).await.map_err(failed)?;
        Ok(json!(true))
    });
    reg.typed(
        "bdev_lvol_grow_lvstore",
        "Grows an lvstore to the size its base bdev has now.",
        |_, a: LvsRef| async move {
            let l = pick_lvs(a.uuid.as_deref(), a.lvs_name.as_deref())?;
            lvs::grow(&l).await.map_err(failed)?;
            Ok(json!(true))
        },
    );
    reg.typed("bdev_lvol_rename_lvstore", "Renames an lvstore.", |_, a: Rename| async move {
        // ENOENT, as SPDK's answer names.
        let l = lvs::by_name(&a.old_name)
            .ok_or_else(|| errno_error(libc::ENOENT, format!("Lvol store {} not found", a.old_name)))?;
        lvs::rename_lvstore(&l, &a.new_name).await.map_err(failed)?;
        Ok(json!(true))
    });
}

/// Unloads every lvstore (daemon shutdown, after the bdevs are gone).
pub async fn shutdown() {
    lvs::shutdown().await;
}
