//! JSON-RPC methods of the error module: bdev_error_create, bdev_error_delete,
//! bdev_error_inject_error, bdev_error_resume_pending (SPDK's names, parameters and results).

use super::{clear, create, disarm_pending, inject, resume_pending_here, ErrorType, Injection, MODULE};
use crate::passthru::base::{delete, rpc_err, NameParam};
use crate::passthru::deferred;
use ferrite_bdev::IoType;
use ferrite_rpc::{errno_error, Registry, RpcError};
use serde::Deserialize;
use serde_json::json;

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct ErrorCreate {
    /// The base bdev.
    #[schemars(example = &"Malloc0")]
    base_name: String,
    /// The UUID to give (random if not given).
    uuid: Option<String>,
}

/// SPDK's `io_type` values of an injection.
#[derive(Deserialize, Clone, Copy, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
enum InjectIoType {
    Clear,
    Read,
    Write,
    Unmap,
    Flush,
    All,
}

/// SPDK's `error_type` values.
#[derive(Deserialize, Clone, Copy, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
enum InjectErrorType {
    Failure,
    Pending,
    CorruptData,
    Nomem,
    NvmeFailure,
}

fn default_num() -> u32 {
    1
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct InjectError {
    /// The error bdev (`EE_...`).
    #[schemars(example = &"EE_Malloc0")]
    name: String,
    /// Which I/Os: a type, `all`, or `clear` to disarm.
    #[schemars(example = &"read")]
    io_type: InjectIoType,
    /// What happens to them.
    error_type: InjectErrorType,
    /// How many I/Os.
    #[serde(default = "default_num")]
    num: u32,
    /// Only while this many I/Os are outstanding or more.
    #[serde(default)]
    queue_depth: u64,
    /// Byte of the data to corrupt (`corrupt_data`).
    #[serde(default)]
    corrupt_offset: u64,
    /// Value XORed into it (`corrupt_data`, not 0).
    #[serde(default)]
    corrupt_value: u8,
    /// NVMe status code type (`nvme`).
    #[serde(default)]
    nvme_sct: u32,
    /// NVMe status code (`nvme`).
    #[serde(default)]
    nvme_sc: u32,
}

fn invalid(msg: &str) -> RpcError {
    errno_error(libc::EINVAL, msg.to_string())
}

/// Registers the error module's methods.
pub fn register(reg: &mut Registry) {
    reg.typed(
        "bdev_error_create",
        "Creates an error-injection bdev `EE_<base_name>` over a base bdev.",
        |_, p: ErrorCreate| async move {
            let (base, uuid) = (p.base_name.clone(), p.uuid.clone());
            // Over a base that is not there yet, the error bdev appears when the base does.
            deferred::create_or_defer(MODULE, &p.base_name, &format!("EE_{}", p.base_name), move || {
                create(&base, uuid.as_deref())
            })
            .map_err(rpc_err)?;
            Ok(json!(true))
        },
    );
    reg.typed("bdev_error_delete", "Deletes an error bdev.", |_, p: NameParam| async move {
        if deferred::forget(MODULE, &p.name) {
            return Ok(json!(true));
        }
        delete(&p.name, MODULE).await
    });
    reg.typed(
        "bdev_error_inject_error",
        "Arms an error bdev to fail, corrupt or hold some of its next I/Os.",
        |_, p: InjectError| async move {
            let nvme = matches!(p.error_type, InjectErrorType::NvmeFailure);
            if nvme == (p.nvme_sct == 0 && p.nvme_sc == 0) {
                return Err(invalid(
                    "nvme_sct or nvme_sc should be specified for NVMe error injection (and only for it)",
                ));
            }
            let (Ok(nvme_sct), Ok(nvme_sc)) = (u8::try_from(p.nvme_sct), u8::try_from(p.nvme_sc)) else {
                return Err(invalid("nvme_sct and nvme_sc must be at most 255"));
            };
            let error_type = match p.error_type {
                InjectErrorType::Failure => ErrorType::Failure,
                InjectErrorType::Pending => ErrorType::Pending,
                InjectErrorType::CorruptData => ErrorType::CorruptData,
                InjectErrorType::Nomem => ErrorType::NoMem,
                InjectErrorType::NvmeFailure => ErrorType::NvmeFailure,
            };
            let inj = Injection {
                error_type,
                num: p.num,
                queue_depth: p.queue_depth,
                corrupt_offset: p.corrupt_offset,
                corrupt_value: p.corrupt_value,
                nvme_sct,
                nvme_sc,
            };
            let io_type = match p.io_type {
                InjectIoType::Clear => {
                    clear(&p.name).map_err(rpc_err)?;
                    return Ok(json!(true));
                }
                InjectIoType::All => None,
                InjectIoType::Read => Some(IoType::Read),
                InjectIoType::Write => Some(IoType::Write),
                InjectIoType::Unmap => Some(IoType::Unmap),
                InjectIoType::Flush => Some(IoType::Flush),
            };
            inject(&p.name, io_type, inj).map_err(rpc_err)?;
            Ok(json!(true))
        },
    );
    reg.typed(
        "bdev_error_resume_pending",
        "Releases the I/Os an error bdev holds pending.",
        |ctx, p: NameParam| async move {
            let id = disarm_pending(&p.name).map_err(rpc_err)?;
            let resumed = ctx.engine.on_all(move |_| resume_pending_here(id)).await.unwrap_or_default();
            log::info!("{}: resumed {} pending I/O(s)", p.name.escape_debug(), resumed.iter().sum::<usize>());
            Ok(json!(true))
        },
    );
}
