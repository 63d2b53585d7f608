//! The base-bdev half that every virtual bdev shares (passthru, delay, error, and the ones to
//! come): open the base bdev for writing and claim it, describe a bdev with its geometry, limits
//! and I/O types, forward requests to it with `IoChannel::forward`, unregister the virtual
//! bdev when the base goes away, and close the base once the virtual bdev is gone.
//!
//! Life cycle: `BaseBdev::open` (claims the base) → `register` of the virtual bdev →
//! [`BaseBdev::attach`]. Deleting the virtual bdev ([`delete`]) or its base (the descriptor's
//! `on_remove`) unregisters the virtual bdev; once its last opener has closed it, the base
//! descriptor is closed too, which releases the claim and lets a pending delete of the base
//! finish. In-flight requests complete normally throughout (a request the base refuses because
//! it is being deleted completes with `Removed`).

use ferrite_bdev::bdev::{lookup, unregister, Bdev, BdevError, BdevProps, Limits};
use ferrite_bdev::channel::IoChannel;
use ferrite_bdev::desc::{BdevDesc, BdevEvent};
use ferrite_bdev::io::{IoType, IoTypes};
use ferrite_rpc::{errno_error, RpcError, RpcResult};
use serde::Deserialize;
use serde_json::json;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A virtual bdev's hold on its base bdev: a claimed, writable descriptor.
pub struct BaseBdev {
    bdev: Bdev,
    module: &'static str,
    desc: Mutex<Option<BdevDesc>>,
    /// Id and name of the virtual bdev over it, once registered.
    vbdev: Mutex<Option<(u64, String)>>,
    /// A read-only descriptor of the virtual bdev itself, whose `on_remove` tells this base
    /// that the virtual bdev is being unregistered.
    watch: Mutex<Option<BdevDesc>>,
    /// What the module does when its virtual bdev starts going away (release held I/O).
    on_removed: Mutex<Option<RemovedHook>>,
}

/// What a module runs when its virtual bdev starts going away (see `on_vbdev_removed`).
type RemovedHook = Box<dyn Fn(u64) + Send + Sync>;

/// Most virtual bdevs stacked on one another. Each level adds a trip through the bdev layer on
/// the reactor's stack (submission and completion recurse through the levels): thousands of
/// levels overflowed it and killed the daemon.
pub const MAX_STACK_DEPTH: u32 = 32;

/// How many virtual bdevs (of the modules built on `BaseBdev`) stand under `bdev`, itself
/// included: 0 for a base bdev.
pub fn stack_depth(bdev: &Bdev) -> u32 {
    let mut depth = 0;
    let mut id = bdev.id();
    while let Some(base) = BaseBdev::of(id) {
        depth += 1;
        id = base.bdev.id();
    }
    depth
}

/// Every base held by a virtual bdev (to find the base of a virtual bdev by its id).
/// Every base bdev attached by a virtual bdev of this engine.
#[derive(Default)]
struct Attached(Vec<Weak<BaseBdev>>);

fn attached() -> ferrite_reactor::StateGuard<Attached> {
    ferrite_reactor::lock_state::<Attached>()
}

impl BaseBdev {
    /// Opens `base_name` for writing and claims it for `module`. Fails if it does not exist,
    /// is being deleted, is claimed, or has another writer.
    pub fn open(base_name: &str, module: &'static str) -> Result<Arc<BaseBdev>, BdevError> {
        if let Some(b) = ferrite_bdev::bdev::lookup(base_name) {
            if stack_depth(&b) >= MAX_STACK_DEPTH {
                return Err(BdevError::Invalid(format!(
                    "bdev {base_name} already stands on {MAX_STACK_DEPTH} virtual bdevs; no deeper stacks"
                )));
            }
        }
        let me: Arc<OnceLock<Weak<BaseBdev>>> = Arc::default();
        let me2 = me.clone();
        let desc = Bdev::open_ext(base_name, true, move |ev| {
            if let Some(b) = me2.get().and_then(Weak::upgrade) {
                match ev {
                    BdevEvent::Remove => b.base_removed(),
                    BdevEvent::IoTypesChanged => b.base_stopped_serving(),
                    // A virtual bdev keeps its base's media events and faults to itself, as SPDK's
                    // passthru does.
                    BdevEvent::Resize | BdevEvent::MediaManagement | BdevEvent::Fault => {}
                }
            }
        })?;
        desc.claim(module)?;
        let base = Arc::new(BaseBdev {
            bdev: desc.bdev().clone(),
            module,
            desc: Mutex::new(Some(desc)),
            vbdev: Mutex::new(None),
            watch: Mutex::new(None),
            on_removed: Mutex::new(None),
        });
        let _ = me.set(Arc::downgrade(&base));
        Ok(base)
    }

    /// The base bdev.
    pub fn bdev(&self) -> &Bdev {
        &self.bdev
    }

    /// True if the base lends its memory for zero-copy reads: then so does a virtual bdev that
    /// passes reads through (its `lends_reads` and `zcopy`), and lent buffers travel up unchanged.
    pub fn lends_reads(&self) -> bool {
        self.bdev.backend().zcopy()
    }

    /// The I/O types a virtual bdev that forwards everything serves: every type the base serves
    /// (itself or through the bdev layer), and abort, which it passes on.
    pub fn io_types(&self) -> IoTypes {
        IoType::ALL
            .iter()
            .filter(|t| self.bdev.supports(**t))
            .fold(IoTypes::default(), |s, t| s.with(*t))
            .with(IoType::Abort)
    }

    /// Properties of a virtual bdev with the base's geometry, limits and I/O types.
    pub fn props(
        &self,
        name: String,
        uuid: Option<uuid::Uuid>,
        product_name: &'static str,
        module: &'static str,
    ) -> BdevProps {
        let limits: Limits = *self.bdev.limits();
        BdevProps {
            name,
            aliases: vec![],
            uuid,
            block_size: self.bdev.block_size(),
            num_blocks: self.bdev.num_blocks(),
            product_name,
            module,
            io_types: self.io_types(),
            limits,
        }
    }

    /// This core's channel to the base (made on first use on each core).
    pub fn channel(&self) -> Result<IoChannel, BdevError> {
        match &*lock(&self.desc) {
            Some(d) => d.channel(),
            None => Err(BdevError::Removing(self.bdev.name().to_string())),
        }
    }

    /// Records the virtual bdev registered over this base, and watches it: however it is
    /// unregistered (its delete method, its base going away, daemon shutdown), the module's
    /// hook (`on_vbdev_removed`) runs at once, and the base is closed by the module's destruct
    /// (`BaseBdev::close` from `BdevBackend::destruct`) once its last opener has closed it. If
    /// the base started going away meanwhile, the virtual bdev is unregistered at once.
    pub fn attach(self: &Arc<Self>, vbdev: &Bdev) {
        *lock(&self.vbdev) = Some((vbdev.id(), vbdev.name().to_string()));
        {
            let mut all = attached();
            all.0.retain(|w| w.strong_count() > 0);
            all.0.push(Arc::downgrade(self));
        }
        let me = Arc::downgrade(self);
        match Bdev::open(vbdev.name(), false, move || {
            if let Some(b) = me.upgrade() {
                b.vbdev_removed();
            }
        }) {
            Ok(watch) => *lock(&self.watch) = Some(watch),
            Err(e) => log::warn!("{}: cannot watch {}: {e}", self.module, vbdev.name()),
        }
        if self.bdev.is_removing() {
            self.base_removed();
        }
    }

    /// The virtual bdev is being unregistered: stop watching it (the watch is one of its
    /// openers), and let the module release what it holds (its other openers finish their
    /// in-flight I/O first). Its destruct closes the base.
    fn vbdev_removed(self: &Arc<Self>) {
        let Some(watch) = lock(&self.watch).take() else { return };
        let id = watch.bdev().id();
        if let Some(f) = lock(&self.on_removed).as_ref() {
            f(id);
        }
        drop(watch);
    }

    /// Sets what to do when the virtual bdev starts going away, before its openers are waited
    /// for: a module that holds requests (pending fault injection) completes them, or the
    /// openers would wait for them forever. Gets the virtual bdev's id; runs on the core that
    /// attached it.
    pub fn on_vbdev_removed(&self, f: impl Fn(u64) + Send + Sync + 'static) {
        *lock(&self.on_removed) = Some(Box::new(f));
    }

    /// Id of the virtual bdev over this base, once attached.
    pub fn vbdev_id(&self) -> Option<u64> {
        lock(&self.vbdev).as_ref().map(|(id, _)| *id)
    }

    /// The base of the virtual bdev with id `vbdev_id`.
    pub fn of(vbdev_id: u64) -> Option<Arc<BaseBdev>> {
        attached()
            .0
            .iter()
            .filter_map(Weak::upgrade)
            .find(|b| lock(&b.vbdev).as_ref().is_some_and(|(id, _)| *id == vbdev_id))
    }

    /// Closes the base descriptor (releasing the claim).
    pub fn close(&self) {
        let desc = lock(&self.desc).take();
        if desc.is_some() {
            log::info!("{}: closed base bdev {}", self.module, self.bdev.name());
        }
    }

    /// The base stopped serving some types (an lvol made read-only): the virtual bdev over it
    /// stops serving them too, and so tells its own openers (a namespace on it).
    fn base_stopped_serving(self: &Arc<Self>) {
        let Some((id, name)) = lock(&self.vbdev).clone() else { return };
        let Some(v) = lookup(&name).filter(|b| b.id() == id) else { return };
        let gone = IoType::ALL
            .iter()
            .filter(|t| **t != IoType::Abort && !self.bdev.supports(**t))
            .fold(IoTypes::default(), |s, t| s.with(*t));
        v.stop_serving(gone);
    }

    /// The base is being deleted: unregister the virtual bdev over it.
    fn base_removed(self: &Arc<Self>) {
        let Some((id, name)) = lock(&self.vbdev).clone() else { return };
        if lookup(&name).is_none_or(|b| b.id() != id) {
            return; // already being deleted
        }
        log::info!("{}: base bdev {} is going away; unregistering {}", self.module, self.bdev.name(), name);
        // The watch set up by `attach` closes the base once the virtual bdev is gone.
        if let Err(e) = unregister(&name, Some(self.module)) {
            log::warn!("{}: cannot unregister {name}: {e}", self.module);
        }
    }
}

/// Params of a virtual bdev's delete method.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct NameParam {
    /// The bdev's name.
    pub(crate) name: String,
}

/// Deletes the virtual bdev `name` of `module`: unregisters it, waits until every opener has
/// closed it, then closes its base (releasing the claim).
pub async fn delete_vbdev(name: &str, module: &'static str) -> Result<(), BdevError> {
    let b = lookup(name)
        .filter(|b| b.module() == module && b.name() == name)
        .ok_or_else(|| BdevError::NotFound(format!("{name} (no {module} bdev has this name)")))?;
    let base = BaseBdev::of(b.id());
    let gone = unregister(name, Some(module))?;
    gone.await.map_err(|e| BdevError::Os(e.to_string()))?;
    if let Some(base) = base {
        base.close();
    }
    log::info!("deleted {module} bdev {}", name.escape_debug());
    Ok(())
}

/// The RPC form of [`delete_vbdev`]: answers `true`, or -ENODEV as SPDK does.
pub(crate) async fn delete(name: &str, module: &'static str) -> RpcResult {
    delete_vbdev(name, module).await.map_err(|e| match e {
        BdevError::NotFound(_) => errno_error(libc::ENODEV, format!("No such device: no {module} bdev named {name}")),
        e => errno_error(e.errno(), e.to_string()),
    })?;
    Ok(json!(true))
}

/// A `BdevError` as a JSON-RPC error (errno as the code, as SPDK answers).
pub(crate) fn rpc_err(e: BdevError) -> RpcError {
    errno_error(e.errno(), e.to_string())
}
