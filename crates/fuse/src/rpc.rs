//! FUSE export methods (Ferrite's own, named in SPDK's style): fuse_export_add,
//! fuse_export_remove, fuse_get_exports; kept by save_config as the "fuse" subsystem.

use crate::file::{close_local, open_local, BdevFile};
use ferrite_rpc::{errno_error, Ctx, Registry, RpcError, Subsystem};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

struct Export {
    id: u64,
    bdev: String,
    read_only: bool,
    reactor: usize,
    created_file: bool,
    gone: Arc<AtomicBool>,
    session: Option<fuser::BackgroundSession>,
}

/// One engine's FUSE exports, by path.
#[derive(Default)]
struct Exports(BTreeMap<String, Export>);

fn exports() -> ferrite_reactor::StateGuard<Exports> {
    ferrite_reactor::lock_state::<Exports>()
}
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Add {
    /// The bdev to export.
    bdev_name: String,
    /// Path of the file to create (its directory is mounted over).
    path: String,
    /// Read-only export.
    read_only: Option<bool>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Path {
    /// Path of the exported file.
    path: String,
}

fn mount(ctx: &Ctx, a: Add) -> Result<(), RpcError> {
    let path = std::path::PathBuf::from(&a.path);
    if !path.is_absolute() {
        return Err(errno_error(libc::EINVAL, format!("path {} must be absolute", a.path)));
    }
    if exports().0.contains_key(&a.path) {
        return Err(errno_error(libc::EEXIST, format!("{} is already a FUSE export", a.path)));
    }
    let bdev = ferrite_bdev::lookup(&a.bdev_name)
        .ok_or_else(|| errno_error(libc::ENODEV, format!("No such device: bdev {} not found", a.bdev_name)))?;
    let read_only = a.read_only.unwrap_or(false);
    // The export appears at `path`, which must be a regular file (made empty if missing).
    let created_file = !path.exists();
    if created_file {
        std::fs::File::create(&path).map_err(|e| errno_error(libc::EIO, format!("cannot create {}: {e}", a.path)))?;
    } else if !path.is_file() {
        return Err(errno_error(libc::EINVAL, format!("{} exists and is not a regular file", a.path)));
    }
    let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
    let reactor = (id as usize) % ctx.engine.count();
    let gone = Arc::new(AtomicBool::new(false));
    let (name, g) = (a.bdev_name.clone(), gone.clone());
    let opened =
        ctx.engine.call(reactor, move || open_local(id, &name, !read_only, g)).wait_or(Err("reactor stopped".into()));
    if let Err(e) = opened {
        if created_file {
            let _ = std::fs::remove_file(&path);
        }
        return Err(errno_error(libc::EBUSY, format!("cannot open bdev {}: {e}", a.bdev_name)));
    }
    // SAFETY: getuid/getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let fs = BdevFile {
        id,
        engine: ctx.engine.clone(),
        reactor,
        size: bdev.size_bytes(),
        block_size: bdev.block_size() as u64,
        read_only,
        gone: gone.clone(),
        uid,
        gid,
    };
    let mut cfg = fuser::Config::default();
    cfg.mount_options = vec![
        fuser::MountOption::FSName(format!("ferrite:{}", a.bdev_name)),
        fuser::MountOption::Subtype("ferrite".into()),
        fuser::MountOption::DefaultPermissions,
        if read_only { fuser::MountOption::RO } else { fuser::MountOption::RW },
    ];
    let session = match fuser::spawn_mount(fs, &path, &cfg) {
        Ok(s) => s,
        Err(e) => {
            let _ = ctx.engine.call(reactor, move || close_local(id)).wait();
            if created_file {
                let _ = std::fs::remove_file(&path);
            }
            return Err(errno_error(
                e.raw_os_error().unwrap_or(libc::EIO),
                format!("cannot mount FUSE at {}: {e}", a.path),
            ));
        }
    };
    log::info!("FUSE export of bdev {} at {} (reactor {reactor})", a.bdev_name, a.path);
    exports().0.insert(
        a.path,
        // The bdev's own name, not the alias it was named by: a renamed lvol keeps it.
        Export { id, bdev: bdev.name().to_string(), read_only, reactor, created_file, gone, session: Some(session) },
    );
    Ok(())
}

trait WaitOr<T> {
    fn wait_or(self, default: T) -> T;
}

impl<T> WaitOr<T> for ferrite_reactor::oneshot::Receiver<T> {
    fn wait_or(self, default: T) -> T {
        self.wait().unwrap_or(default)
    }
}

fn unmount(engine: &ferrite_reactor::Engine, path: &str) -> Result<(), RpcError> {
    let mut e =
        exports().0.remove(path).ok_or_else(|| errno_error(libc::ENOENT, format!("{path} is not a FUSE export")))?;
    // Dropping the session unmounts and joins its thread; then the descriptor closes. If the
    // file is still open somewhere the unmount fails with EBUSY: detach it lazily instead.
    drop(e.session.take());
    if std::fs::read_to_string("/proc/mounts").is_ok_and(|m| m.lines().any(|l| l.split(' ').nth(1) == Some(path))) {
        if let Ok(c) = std::ffi::CString::new(path) {
            // SAFETY: umount2 with a valid NUL-terminated path.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
    let id = e.id;
    let _ = engine.call(e.reactor, move || close_local(id)).wait();
    if e.created_file {
        let _ = std::fs::remove_file(path);
    }
    log::info!("FUSE export at {path} removed");
    Ok(())
}

/// Registers the methods and the "fuse" subsystem.
pub fn register(reg: &mut Registry) {
    // Mounting and unmounting block on the kernel, so they run on a helper thread, never on the
    // reactor (the FUSE session's first requests are served by the reactors).
    reg.typed("fuse_export_add", "Exports a bdev as a regular file through FUSE.", |ctx, a: Add| async move {
        let c = ctx.clone();
        blocking(move || mount(&c, a)).await?;
        Ok(json!(true))
    });
    reg.typed("fuse_export_remove", "Removes a FUSE export (unmounts it).", |ctx, a: Path| async move {
        let c = ctx.clone();
        blocking(move || unmount(&c.engine, &a.path)).await?;
        Ok(json!(true))
    });
    reg.bare("fuse_get_exports", "The FUSE exports.", |_| async move {
        Ok(Value::Array(
            exports()
                .0
                .iter()
                .map(|(path, e)| {
                    json!({"path": path, "bdev_name": e.bdev, "read_only": e.read_only, "reactor": e.reactor,
                        "bdev_removed": e.gone.load(Ordering::SeqCst)})
                })
                .collect(),
        ))
    });
    reg.subsystem(Subsystem {
        name: "fuse",
        depends_on: vec!["bdev"],
        config: Arc::new(|| {
            exports().0.iter()
                .map(|(path, e)| {
                    json!({"method": "fuse_export_add", "params": {"bdev_name": e.bdev, "path": path, "read_only": e.read_only}})
                })
                .collect()
        }),
    });
}

/// Runs `f` on a helper thread and awaits its result.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = ferrite_reactor::oneshot::channel();
    // The helper belongs to the caller's engine (the bdevs it looks up are that engine's).
    let engine = ferrite_reactor::current_engine();
    std::thread::spawn(move || {
        let _entered = engine.as_ref().map(|e| e.enter());
        tx.send(f())
    });
    rx.await.expect("helper thread answers")
}

/// Unmounts every export (daemon shutdown; call from a plain thread, not a reactor).
pub fn shutdown(engine: &ferrite_reactor::Engine) {
    let paths: Vec<String> = exports().0.keys().cloned().collect();
    for p in paths {
        if let Err(e) = unmount(engine, &p) {
            log::warn!("FUSE export {p}: {}", e.message);
        }
    }
}
