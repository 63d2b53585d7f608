//! Per-reactor state kept in thread-locals, made swappable for the simulator.
//!
//! On a real engine each reactor is a thread, so a thread-local is per-reactor state, and the hot
//! paths (the bdev layer's request cache and completion queue, its channel table) read it at
//! thread-local speed. The simulator runs every reactor of an engine on one thread; for that, a
//! thread-local declared with [`reactor_local!`](crate::reactor_local) registers itself on first
//! use, and the simulator moves each registered value out when it switches a reactor out and
//! back in when it switches it in. Outside a simulation this costs nothing but the registration.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::thread::LocalKey;

/// A thread-local whose value can be taken out and put back (by the simulator).
pub trait Swappable: Sync {
    /// Moves the value out, leaving the default.
    fn take_out(&'static self) -> Box<dyn Any>;
    /// Puts a value taken out before back, or the default.
    fn put_back(&'static self, v: Option<Box<dyn Any>>);
}

impl<T: Default + 'static> Swappable for LocalKey<RefCell<T>> {
    fn take_out(&'static self) -> Box<dyn Any> {
        Box::new(self.with(|c| c.take()))
    }
    fn put_back(&'static self, v: Option<Box<dyn Any>>) {
        let v = v.map(|b| *b.downcast::<T>().expect("a reactor-local keeps its type")).unwrap_or_default();
        // The old value (the default left by take_out, or an off-reactor one) drops here.
        let old = self.with(|c| c.replace(v));
        drop(old);
    }
}

impl<T: Default + 'static> Swappable for LocalKey<Cell<T>> {
    fn take_out(&'static self) -> Box<dyn Any> {
        Box::new(self.with(|c| c.take()))
    }
    fn put_back(&'static self, v: Option<Box<dyn Any>>) {
        let v = v.map(|b| *b.downcast::<T>().expect("a reactor-local keeps its type")).unwrap_or_default();
        self.with(|c| c.set(v));
    }
}

thread_local! {
    static REGISTERED: RefCell<Vec<&'static dyn Swappable>> = const { RefCell::new(Vec::new()) };
}

/// Records a reactor-local of this thread (called by [`reactor_local!`](crate::reactor_local) when
/// the value is first made).
pub fn register(key: &'static dyn Swappable) {
    let _ = REGISTERED.try_with(|r| r.borrow_mut().push(key));
}

/// The values of one reactor while it is switched out, by registration index.
#[derive(Default)]
pub(crate) struct Stash(Vec<Option<Box<dyn Any>>>);

/// Moves every registered value of this thread into a stash.
pub(crate) fn take_all() -> Stash {
    let keys = REGISTERED.with(|r| r.borrow().clone());
    Stash(keys.into_iter().map(|k| Some(k.take_out())).collect())
}

/// Puts a stash's values back (defaults for reactor-locals registered after it was taken).
pub(crate) fn put_all(mut stash: Stash) {
    let keys = REGISTERED.with(|r| r.borrow().clone());
    for (i, k) in keys.into_iter().enumerate() {
        k.put_back(stash.0.get_mut(i).and_then(Option::take));
    }
}

/// Declares per-reactor state: a thread-local (so the hot path reads it as one) that the
/// simulator can swap when several reactors share a thread. The type must be a `RefCell<T>` or
/// `Cell<T>` with `T: Default`.
///
/// ```ignore
/// ferrite_reactor::reactor_local! {
///     static QUEUE: RefCell<Vec<u64>> = RefCell::new(Vec::new());
/// }
/// ```
#[macro_export]
macro_rules! reactor_local {
    ($(#[$attr:meta])* $vis:vis static $name:ident: $t:ty = $init:expr;) => {
        ::std::thread_local! {
            $(#[$attr])* $vis static $name: $t = {
                $crate::local::register(&$name);
                $init
            };
        }
    };
}
