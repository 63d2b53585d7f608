//! Per-reactor state kept in thread-locals, made swappable for the simulator.
//!
//! On a real engine each reactor is a thread, so a thread-local is per-reactor state, and the hot
//! paths (the bdev layer's request cache and completion queue, its channel table) read it at
//! thread-local speed. The simulator runs every reactor of an engine on one thread; for that, a
//! thread-local declared with [`reactor_local!`](crate::reactor_local) is listed at link time
//! (linkme), and the simulator moves each listed value out when it switches a reactor out and
//! back in when it switches it in. Outside a simulation this costs nothing.

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

/// Every reactor-local of the program, collected at link time (so that declaring one costs
/// nothing at run time, and its thread-local keeps a `const` initialiser where it has one).
#[linkme::distributed_slice]
pub static REACTOR_LOCALS: [&'static dyn Swappable];

/// The values of one reactor while it is switched out, by index in [`REACTOR_LOCALS`].
#[derive(Default)]
pub(crate) struct Stash(Vec<Option<Box<dyn Any>>>);

/// Moves every reactor-local value of this thread into a stash.
pub(crate) fn take_all() -> Stash {
    Stash(REACTOR_LOCALS.iter().map(|k| Some(k.take_out())).collect())
}

/// Puts a stash's values back (defaults where the stash has none).
pub(crate) fn put_all(mut stash: Stash) {
    for (i, k) in REACTOR_LOCALS.iter().enumerate() {
        k.put_back(stash.0.get_mut(i).and_then(Option::take));
    }
}

/// Declares per-reactor state: a thread-local (so the hot path reads it as one) that the
/// simulator can swap when several reactors share a thread. The type must be a `RefCell<T>` or
/// `Cell<T>` with `T: Default`; a `const { .. }` initialiser is kept const.
///
/// ```ignore
/// ferrite_reactor::reactor_local! {
///     static QUEUE: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
/// }
/// ```
#[macro_export]
macro_rules! reactor_local {
    ($(#[$attr:meta])* $vis:vis static $name:ident: $t:ty = const $init:block;) => {
        ::std::thread_local! {
            $(#[$attr])* $vis static $name: $t = const $init;
        }
        $crate::reactor_local!(@register $name);
    };
    ($(#[$attr:meta])* $vis:vis static $name:ident: $t:ty = $init:expr;) => {
        ::std::thread_local! {
            $(#[$attr])* $vis static $name: $t = $init;
        }
        $crate::reactor_local!(@register $name);
    };
    (@register $name:ident) => {
        const _: () = {
            #[$crate::linkme::distributed_slice($crate::local::REACTOR_LOCALS)]
            #[linkme(crate = $crate::linkme)]
            static REGISTER: &'static dyn $crate::local::Swappable = &$name;
        };
    };
}
