//! State that belongs to an engine instance rather than to the process.
//!
//! Layers above the engine (the bdev registry, module tables, export tables) keep their shared
//! state in the engine they run on, keyed by type: [`engine_state`] finds it. Two engines in one
//! process (an NVMe/TCP host and a target in one test, say) therefore never share bdevs or
//! exports. Code that runs on a reactor uses that reactor's engine; a plain thread uses the
//! engine it entered ([`Engine::enter`]; the thread that starts an engine is entered into it
//! until [`Engine::join`]); anything else uses one process-wide default, which is what tests
//! without an engine see.

use crate::reactor::Engine;
use std::any::{Any, TypeId};
use std::cell::RefCell;
use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

/// Values keyed by their type, made on first use.
#[derive(Default)]
pub(crate) struct Extensions(Mutex<HashMap<TypeId, Arc<dyn Any + Send + Sync>>>);

impl Extensions {
    /// The `T` of this set, made with `T::default()` on first use.
    pub(crate) fn get<T: Default + Send + Sync + 'static>(&self) -> Arc<T> {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let v = map.entry(TypeId::of::<T>()).or_insert_with(|| Arc::new(T::default()));
        v.clone().downcast::<T>().expect("extension stored under its own type")
    }

    /// Drops every value (breaking cycles through values that hold the engine).
    pub(crate) fn clear(&self) {
        let values: Vec<_> = self.0.lock().unwrap_or_else(|p| p.into_inner()).drain().collect();
        drop(values);
    }
}

thread_local! {
    /// Engines entered by this (non-reactor) thread, innermost last.
    static ENTERED: RefCell<Vec<Engine>> = const { RefCell::new(Vec::new()) };
}

fn default_extensions() -> &'static Extensions {
    static DEFAULT: OnceLock<Extensions> = OnceLock::new();
    DEFAULT.get_or_init(Extensions::default)
}

/// The engine the calling thread belongs to: its reactor's, else the one it entered last.
pub fn current_engine() -> Option<Engine> {
    if let Some(e) = crate::reactor::try_engine() {
        return Some(e);
    }
    ENTERED.try_with(|s| s.borrow().last().cloned()).ok().flatten()
}

/// The calling context's `T` (see the module documentation for which engine that is), made
/// with `T::default()` on first use. Takes a lock: for control paths, not per I/O.
pub fn engine_state<T: Default + Send + Sync + 'static>() -> Arc<T> {
    match current_engine() {
        Some(e) => e.extensions().get::<T>(),
        None => default_extensions().get::<T>(),
    }
}

/// Keeps the calling thread entered into an engine until dropped.
#[must_use = "the thread leaves the engine when the guard is dropped"]
pub struct EnterGuard {
    engine: Engine,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for EnterGuard {
    fn drop(&mut self) {
        leave(&self.engine);
    }
}

/// Enters the calling thread into `engine` (innermost wins).
pub(crate) fn enter(engine: &Engine) -> EnterGuard {
    enter_unguarded(engine);
    EnterGuard { engine: engine.clone(), _not_send: std::marker::PhantomData }
}

/// Enters the calling thread into `engine` with no guard (until [`leave`]).
pub(crate) fn enter_unguarded(engine: &Engine) {
    ENTERED.with(|s| s.borrow_mut().push(engine.clone()));
}

/// Removes the innermost entry of `engine` from the calling thread, if it has one.
pub(crate) fn leave(engine: &Engine) {
    let _ = ENTERED.try_with(|s| {
        let mut s = s.borrow_mut();
        if let Some(i) = s.iter().rposition(|e| e.same(engine)) {
            s.remove(i);
        }
    });
}

/// The calling context's `T` (as [`engine_state`] finds it), locked until the guard drops.
pub fn lock_state<T: Default + Send + 'static>() -> StateGuard<T> {
    let owner = engine_state::<Mutex<T>>();
    let guard = owner.lock().unwrap_or_else(|p| p.into_inner());
    // SAFETY: the guard borrows the mutex inside `owner`, an Arc whose heap allocation does not
    // move and lives in the same StateGuard; Drop releases the guard before the Arc.
    let guard: MutexGuard<'static, T> = unsafe { std::mem::transmute(guard) };
    StateGuard { guard: ManuallyDrop::new(guard), _owner: owner }
}

/// An engine's `T`, locked (see [`lock_state`]).
pub struct StateGuard<T: 'static> {
    guard: ManuallyDrop<MutexGuard<'static, T>>,
    _owner: Arc<Mutex<T>>,
}

impl<T> std::ops::Deref for StateGuard<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.guard
    }
}

impl<T> std::ops::DerefMut for StateGuard<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.guard
    }
}

impl<T> Drop for StateGuard<T> {
    fn drop(&mut self) {
        // SAFETY: dropped once, here, before `_owner` (fields drop after this body).
        unsafe { ManuallyDrop::drop(&mut self.guard) }
    }
}
