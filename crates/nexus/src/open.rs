//! What a child URI names, opened and claimed: an existing bdev, a malloc or uring bdev the nexus
//! makes (or takes, when one of that name already exists unclaimed, as after a restart from a
//! saved config), or namespace 1 of a remote NVMe/TCP subsystem attached through Ferrite's host
//! (`bdev_nvme_attach_controller`, called through the RPC registry so that this crate needs no
//! link to the host's). And closing a child: releasing it, and removing what the nexus made.

use crate::child::Child;
use crate::fence::Fencing;
use crate::nexus::MODULE;
use crate::uri::ChildUri;
use ferrite_bdev::{Bdev, BdevDesc, BdevError, BdevEvent};
use ferrite_rpc::{Ctx, Params, Registry};
use serde_json::json;

/// The NVMe controller name the nexus gives the attach of `uri` (stable, so a restart finds it).
fn nvme_ctrlr_name(uri: &str) -> String {
    let mut h: u32 = 0x811c9dc5;
    for b in uri.bytes() {
        h = (h ^ b as u32).wrapping_mul(0x01000193);
    }
    format!("nexus{h:08x}")
}

/// Makes (or finds) the bdev `p` names; true if the nexus made it.
async fn bdev_for(ctx: &Ctx, uri: &str, p: &ChildUri) -> Result<(String, bool), BdevError> {
    match p {
        ChildUri::Bdev { name } => match ferrite_bdev::lookup(name) {
            Some(b) => Ok((b.name().to_string(), false)),
            None => Err(BdevError::Errno(libc::ENODEV, format!("child {uri}: no bdev {name}"))),
        },
        ChildUri::Malloc { name, size_mb, blk_size } => {
            if let Some(b) = ferrite_bdev::lookup(name) {
                if b.size_bytes() != size_mb << 20 || b.block_size() != *blk_size || b.module() != "malloc" {
                    return Err(BdevError::Errno(libc::EEXIST, format!("child {uri}: another bdev {name} exists")));
                }
                return Ok((name.clone(), false));
            }
            let opts = ferrite_modules::malloc::MallocOpts {
                name: Some(name.clone()),
                num_blocks: (size_mb << 20) / *blk_size as u64,
                block_size: *blk_size,
                ..Default::default()
            };
            let b = ferrite_reactor::spawn_blocking(move || ferrite_modules::malloc::create(opts))
                .await
                .map_err(|e| BdevError::Errno(libc::EIO, e.to_string()))??;
            Ok((b.name().to_string(), true))
        }
        ChildUri::Uring { path, blk_size } => {
            if let Some(b) = ferrite_bdev::lookup(path) {
                return Ok((b.name().to_string(), false));
            }
            let opts = ferrite_modules::uring::UringOpts {
                name: path.clone(),
                filename: path.clone(),
                block_size: (*blk_size != 0).then_some(*blk_size),
                ..Default::default()
            };
            let b = ferrite_reactor::spawn_blocking(move || ferrite_modules::uring::create(opts))
                .await
                .map_err(|e| BdevError::Errno(libc::EIO, e.to_string()))?
                .map_err(|e| BdevError::Errno(e.errno(), format!("child {uri}: {e}")))?;
            Ok((b.name().to_string(), true))
        }
        ChildUri::Nvmf { host, port, nqn } => {
            let ctrlr = nvme_ctrlr_name(uri);
            let ns = format!("{ctrlr}n1");
            if ferrite_bdev::lookup(&ns).is_some() {
                return Ok((ns, false));
            }
            let params = json!({"name": ctrlr, "trtype": "tcp", "adrfam": "ipv4", "traddr": host,
                "trsvcid": port.to_string(), "subnqn": nqn});
            let names = Registry::call(ctx, "bdev_nvme_attach_controller", Params(Some(params)))
                .await
                .map_err(|e| BdevError::Errno(libc::ENODEV, format!("child {uri}: attach: {}", e.message)))?;
            let found = names.as_array().into_iter().flatten().filter_map(|v| v.as_str()).any(|n| n == ns);
            if !found {
                detach(ctx, &ctrlr).await;
                return Err(BdevError::Errno(libc::ENODEV, format!("child {uri}: no namespace 1 ({names})")));
            }
            Ok((ns, true))
        }
    }
}

async fn detach(ctx: &Ctx, ctrlr: &str) {
    let _ = Registry::call(ctx, "bdev_nvme_detach_controller", Params(Some(json!({"name": ctrlr})))).await;
}

/// Opens and claims the child `uri` of nexus `nexus` and takes its reservation (`fence`); true
/// if the nexus made its bdev.
pub(crate) async fn open_child(
    ctx: &Ctx,
    uri: &str,
    p: &ChildUri,
    nexus: &str,
    fencing: &Fencing,
) -> Result<(BdevDesc, bool), BdevError> {
    let (name, made) = bdev_for(ctx, uri, p).await?;
    if made {
        if let Some(b) = ferrite_bdev::lookup(&name) {
            b.set_made_for(nexus);
        }
    }
    let (nx, bname) = (nexus.to_string(), name.clone());
    let opened = Bdev::open_ext(&name, true, move |ev| {
        if ev == BdevEvent::Remove {
            if let Some(n) = crate::nexus::find(&nx) {
                crate::nexus::child_removed(&n, &bname);
            }
        }
    })
    .and_then(|desc| {
        desc.claim(MODULE)
            .map_err(|e| BdevError::Errno(libc::EPERM, format!("child {uri}: bdev {name} is claimed already: {e}")))?;
        Ok(desc)
    });
    let opened = match opened {
        Ok(d) => match crate::fence::acquire(uri, &d, fencing).await {
            Ok(()) => Ok(d),
            Err(e) => Err(e),
        },
        Err(e) => Err(e),
    };
    match opened {
        Ok(d) => Ok((d, made)),
        Err(e) => {
            if made {
                unmake(ctx, p, &name).await;
            }
            Err(match e {
                BdevError::Errno(..) => e,
                other => BdevError::Errno(other.errno(), format!("child {uri}: {other}")),
            })
        }
    }
}

/// Removes a bdev the nexus made.
async fn unmake(ctx: &Ctx, p: &ChildUri, name: &str) {
    match p {
        ChildUri::Nvmf { .. } => detach(ctx, name.strip_suffix("n1").unwrap_or(name)).await,
        ChildUri::Bdev { .. } => {}
        _ => match ferrite_bdev::unregister(name, None) {
            Ok(gone) => {
                let _ = gone.await;
            }
            Err(e) => log::warn!("nexus: removing child bdev {name}: {e}"),
        },
    }
}

/// Releases a child that left its nexus (its reservation, and its claim with its descriptor),
/// and removes its bdev if the nexus made it.
pub(crate) async fn close_child(ctx: &Ctx, mut c: Child, fencing: &Fencing) {
    // A destroyed nexus's bdev dropped its children's descriptors already: one is opened
    // again (unclaimed) for the reservation commands.
    let desc = match c.desc.take() {
        Some(d) => Some(d),
        None if fencing.resv_key != 0 => Bdev::open_ext(&c.bdev_name, true, |_| {}).ok(),
        None => None,
    };
    if let Some(d) = desc {
        crate::fence::leave(&c.uri, &d, fencing).await;
    }
    if c.made {
        unmake(ctx, &c.parsed, &c.bdev_name).await;
    }
}
