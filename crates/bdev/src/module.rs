//! The module registry and examine.
//!
//! Each bdev module registers once: its name, init and fini, its JSON-RPC methods, and its
//! examine callbacks. Every bdev that registers is offered to every module, first synchronously
//! (`examine_config`: look at the bdev's properties and the module's configuration, maybe claim
//! it) and then asynchronously (`examine_disk`: read the disk, e.g. for an lvol store or a GPT,
//! and say when done). That is how lvol stores, GPT partitions and RAID members appear on their
//! own, as in SPDK. `bdev_wait_for_examine` waits until every examine has finished.

use crate::bdev::{Bdev, BdevError};
use ferrite_rpc::Registry;
use serde_json::Value;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// A bdev module, as the registry sees it.
pub trait BdevModule: Send + Sync + 'static {
    /// The module's name (as in `bdev_get_bdevs`' product and SPDK's module names).
    fn name(&self) -> &'static str;
    /// Called once when the module registers.
    fn init(&self) -> Result<(), BdevError> {
        Ok(())
    }
    /// Called once when the daemon stops, after every bdev is gone.
    fn fini(&self) {}
    /// Registers the module's JSON-RPC methods.
    fn register_rpcs(&self, reg: &mut Registry) {
        let _ = reg;
    }
    /// Module-wide entries of a saved config (options), written before any bdev's.
    fn config(&self) -> Vec<Value> {
        Vec::new()
    }
    /// Looks at a newly registered bdev without doing I/O; may open and claim it.
    fn examine_config(&self, bdev: &Bdev) {
        let _ = bdev;
    }
    /// Examines a newly registered bdev, possibly by reading it; drops (or finishes) `done`
    /// when finished, from any thread.
    fn examine_disk(&self, bdev: &Bdev, done: ExamineDone) {
        let _ = bdev;
        done.finish();
    }
}

#[derive(Default)]
struct Examines {
    pending: usize,
    waiters: Vec<ferrite_reactor::oneshot::Sender<()>>,
}

/// The modules of one engine and their examines in progress (see `ferrite_reactor::context`).
struct ModuleState {
    modules: Mutex<Vec<Arc<dyn BdevModule>>>,
    examines: Mutex<Examines>,
    auto_examine: AtomicBool,
}

impl Default for ModuleState {
    fn default() -> Self {
        Self { modules: Mutex::default(), examines: Mutex::default(), auto_examine: AtomicBool::new(true) }
    }
}

fn state() -> Arc<ModuleState> {
    ferrite_reactor::engine_state::<ModuleState>()
}

/// One module's examine of one bdev, in progress; finishing or dropping it ends it.
pub struct ExamineDone {
    finished: bool,
    state: Arc<ModuleState>,
}

impl ExamineDone {
    fn new(state: &Arc<ModuleState>) -> Self {
        state.examines.lock().unwrap().pending += 1;
        Self { finished: false, state: state.clone() }
    }

    /// Ends the examine.
    pub fn finish(mut self) {
        self.end();
    }

    fn end(&mut self) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        let waiters = {
            let mut e = self.state.examines.lock().unwrap();
            e.pending -= 1;
            if e.pending == 0 {
                std::mem::take(&mut e.waiters)
            } else {
                Vec::new()
            }
        };
        for w in waiters {
            w.send(());
        }
    }
}

impl Drop for ExamineDone {
    fn drop(&mut self) {
        self.end();
    }
}

/// Registers a module (once per name) and runs its init.
pub fn register_module(m: Arc<dyn BdevModule>) -> Result<(), BdevError> {
    let st = state();
    let mut mods = st.modules.lock().unwrap();
    if mods.iter().any(|x| x.name() == m.name()) {
        return Ok(());
    }
    m.init()?;
    mods.push(m);
    Ok(())
}

/// Every registered module, in registration order.
pub fn modules() -> Vec<Arc<dyn BdevModule>> {
    state().modules.lock().unwrap().clone()
}

/// Runs every module's fini (the daemon calls it once every bdev is gone).
pub fn fini_all() {
    for m in modules().iter().rev() {
        m.fini();
    }
}

/// SPDK's `bdev_auto_examine` option: with it off, bdevs are examined only on `bdev_examine`.
pub fn set_auto_examine(on: bool) {
    state().auto_examine.store(on, Ordering::Relaxed);
}

/// How long a module's examine may wait for a read of the disk before it gives the bdev up (a
/// remote namespace whose controller never answers must not hold `bdev_wait_for_examine`, nor
/// the start of a run, for long). Every module's examine uses this bound; they run at once.
pub const EXAMINE_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Modules whose bdevs no module's examine reads: their I/O is for tests (an injected error or
/// a delay would be spent on, or hold up, examine's read).
pub const NOT_EXAMINED: [&str; 2] = ["error", "delay"];

/// True if new bdevs are examined on their own.
pub fn auto_examine() -> bool {
    state().auto_examine.load(Ordering::Relaxed)
}

/// Offers a newly registered bdev to every module (if auto examine is on).
pub(crate) fn on_register(bdev: &Bdev) {
    if auto_examine() {
        offer(bdev);
    }
}

/// Offers `bdev` to every module's examine: on the calling reactor, or on the engine's first
/// reactor of the entered engine when called from another thread, or here when there is none.
pub fn offer(bdev: &Bdev) {
    let st = state();
    let mods = st.modules.lock().unwrap().clone();
    if mods.is_empty() {
        return;
    }
    let dones: Vec<ExamineDone> = mods.iter().map(|_| ExamineDone::new(&st)).collect();
    let bdev = bdev.clone();
    let run = move || {
        for m in &mods {
            m.examine_config(&bdev);
        }
        let skip = NOT_EXAMINED.contains(&bdev.module());
        for (m, done) in mods.iter().zip(dones) {
            if bdev.is_removing() || skip {
                done.finish();
                continue;
            }
            m.examine_disk(&bdev, done);
        }
    };
    let engine = if ferrite_reactor::current().is_some() { None } else { ferrite_reactor::current_engine() };
    match engine {
        Some(e) => e.send(0, run),
        None => run(),
    }
}

/// Resolves once no examine is in progress.
pub fn wait_for_examine() -> ferrite_reactor::oneshot::Receiver<()> {
    let (tx, rx) = ferrite_reactor::oneshot::channel();
    let st = state();
    let mut e = st.examines.lock().unwrap();
    if e.pending == 0 {
        tx.send(());
    } else {
        e.waiters.push(tx);
    }
    rx
}
