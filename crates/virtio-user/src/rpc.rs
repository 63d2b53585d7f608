//! SPDK's `bdev_virtio_attach_controller` (trtype "user", dev_type "blk") and
//! `bdev_virtio_detach_controller`. Errors are answered as SPDK answers them: an attach that
//! fails is -32602 (invalid parameters) with the reason, a detach of an unknown name -ENODEV.

use crate::bdev::{attach, AttachOpts, MODULE};
use ferrite_bdev::BdevError;
use ferrite_rpc::{errno_error, Registry, RpcError};
use serde::Deserialize;
use serde_json::json;

/// SPDK's defaults for a virtio-user device.
const DEFAULT_VQ_COUNT: u32 = 1;
const DEFAULT_VQ_SIZE: u32 = 512;

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Attach {
    /// Name of the controller (its bdev is `<name>`).
    #[schemars(example = &"VirtioUser0")]
    name: String,
    /// `user` only.
    #[schemars(example = &"user")]
    trtype: String,
    /// The vhost-user socket's path.
    #[schemars(example = &"/var/tmp/vhost.0")]
    traddr: String,
    /// `blk` only.
    #[schemars(example = &"blk")]
    dev_type: String,
    /// Virtqueues.
    vq_count: Option<u32>,
    /// Entries of a virtqueue.
    vq_size: Option<u32>,
}

fn invalid(msg: impl Into<String>) -> RpcError {
    RpcError::invalid_params(msg.into())
}

impl Attach {
    /// The attach's options; refuses what this module does not serve (PCI and vfio-user
    /// transports, virtio-scsi).
    fn opts(self) -> Result<AttachOpts, RpcError> {
        match self.trtype.to_ascii_lowercase().as_str() {
            "user" => {}
            "pci" | "vfio-user" => {
                return Err(invalid(format!(
                    "Invalid parameters: trtype {} is not supported (only \"user\": a vhost-user socket)",
                    self.trtype
                )))
            }
            _ => return Err(invalid(format!("Invalid parameters: unknown trtype {}", self.trtype))),
        }
        match self.dev_type.to_ascii_lowercase().as_str() {
            "blk" => {}
            "scsi" => return Err(invalid("Invalid parameters: dev_type scsi is not supported (only \"blk\")")),
            _ => return Err(invalid(format!("Invalid parameters: unknown dev_type {}", self.dev_type))),
        }
        if self.name.is_empty() {
            return Err(invalid("Invalid parameters: name must not be empty"));
        }
        // SPDK: 0 (or absent) takes the default.
        let vq_count = match self.vq_count.unwrap_or(0) {
            0 => DEFAULT_VQ_COUNT,
            n => n,
        };
        let vq_size = match self.vq_size.unwrap_or(0) {
            0 => DEFAULT_VQ_SIZE,
            n => n,
        };
        let vq_count = u16::try_from(vq_count)
            .ok()
            .filter(|&n| n <= 256)
            .ok_or_else(|| invalid(format!("Invalid parameters: vq_count {vq_count} is out of range (1 to 256)")))?;
        let vq_size =
            u16::try_from(vq_size).ok().filter(|n| n.is_power_of_two() && (4..=1024).contains(n)).ok_or_else(|| {
                invalid(format!("Invalid parameters: vq_size {vq_size} must be a power of two from 4 to 1024"))
            })?;
        Ok(AttachOpts { name: self.name, socket: self.traddr, vq_count, vq_size })
    }
}

/// An attach failure as SPDK answers it: invalid parameters, with the reason.
fn attach_error(e: BdevError) -> RpcError {
    invalid(format!("{e} ({})", std::io::Error::from_raw_os_error(e.errno())))
}

/// Registers the methods.
pub fn register(reg: &mut Registry) {
    reg.typed(
        "bdev_virtio_attach_controller",
        "Connects to a vhost-user-blk socket and makes the device a bdev.",
        |_, a: Attach| async move {
            let bdev = attach(a.opts()?).await.map_err(attach_error)?;
            // SPDK names a blk device's bdev after the controller and answers the list of bdevs.
            Ok(json!([bdev.name()]))
        },
    );
    /// Params of `bdev_virtio_detach_controller`.
    #[derive(Deserialize, schemars::JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct BdevVirtioDetachController {
        /// The controller.
        name: String,
    }
    reg.typed(
        "bdev_virtio_detach_controller",
        "Disconnects a virtio-user controller (its bdev goes).",
        |_, d: BdevVirtioDetachController| async move {
            let done = ferrite_bdev::unregister(&d.name, Some(MODULE)).map_err(|e| match e {
                BdevError::NotFound(_) => errno_error(libc::ENODEV, format!("No such device: {}", d.name)),
                e => ferrite_bdev::rpc::bdev_err(e),
            })?;
            done.await.map_err(|e| RpcError::internal(e.to_string()))?;
            Ok(json!(true))
        },
    );
}
