//! A reactor's connections of one target, and the reactor's watchdog over them: one timer per
//! reactor (none per connection or command) that runs while the reactor has connections, asks
//! each connection to check its own deadlines, and closes those that did not finish their
//! handshake in time (`ConnCore::handshake_within`).

use crate::conn::ConnCore;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::thread::LocalKey;
use std::time::Duration;

/// A connection a [`ConnTable`] holds.
pub trait Served: 'static {
    /// Its core.
    fn core(&self) -> &ConnCore;
    /// Checks its own deadlines (a peer that stopped reading or sending, protocol timers);
    /// called by the watchdog about once per period with the tick of the check.
    fn watch(&self, now: u64);
}

/// A reactor's connections of one target, by id. Declared by each target as a reactor-local
/// (`RefCell<ConnTable<Conn>>`).
pub struct ConnTable<T: Served> {
    conns: BTreeMap<u64, Rc<T>>,
    watchdog: bool,
    /// The watchdog's list of the connections of one tick, kept with its capacity: a tick
    /// allocates no new list.
    scratch: Vec<Rc<T>>,
}

impl<T: Served> Default for ConnTable<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Served> ConnTable<T> {
    /// An empty table (a `const` initialiser for the reactor-local).
    pub const fn new() -> Self {
        ConnTable { conns: BTreeMap::new(), watchdog: false, scratch: Vec::new() }
    }

    /// Adds a connection.
    pub fn insert(&mut self, c: Rc<T>) {
        let id = c.core().id;
        let old = self.conns.insert(id, c);
        debug_assert!(old.is_none(), "connection ids are unique");
    }

    /// Removes connection `id`.
    pub fn remove(&mut self, id: u64) -> Option<Rc<T>> {
        self.conns.remove(&id)
    }

    /// Connection `id`, if on this reactor.
    pub fn get(&self, id: u64) -> Option<Rc<T>> {
        self.conns.get(&id).cloned()
    }

    /// How many connections the reactor has.
    pub fn len(&self) -> usize {
        self.conns.len()
    }

    /// True if the reactor has none.
    pub fn is_empty(&self) -> bool {
        self.conns.is_empty()
    }

    /// Every connection, for a caller that acts on them with the table released.
    pub fn all(&self) -> Vec<Rc<T>> {
        self.conns.values().cloned().collect()
    }

    /// The connections `pred` selects.
    pub fn select(&self, pred: &dyn Fn(&T) -> bool) -> Vec<Rc<T>> {
        self.conns.values().filter(|c| pred(c)).cloned().collect()
    }
}

/// How a reactor's watchdog runs.
#[derive(Debug, Clone, Copy)]
pub struct WatchdogOptions {
    /// How often it looks.
    pub period: Duration,
    /// The protocol's name in the log.
    pub proto: &'static str,
}

/// Closes the connections of `table` (this reactor's) that `pred` selects; returns how many.
pub fn close_where<T: Served>(table: &'static LocalKey<RefCell<ConnTable<T>>>, pred: &dyn Fn(&T) -> bool) -> usize {
    let picked = table.with(|t| t.borrow().select(pred));
    for c in &picked {
        c.core().close();
    }
    picked.len()
}

/// Adds `c` to `table` (this reactor's) and starts the reactor's watchdog over it if it is not
/// running.
pub fn register<T: Served>(table: &'static LocalKey<RefCell<ConnTable<T>>>, c: Rc<T>, opts: WatchdogOptions) {
    let start = table.with(|t| {
        let mut t = t.borrow_mut();
        t.insert(c);
        !std::mem::replace(&mut t.watchdog, true)
    });
    if start && ferrite_reactor::current().is_some() {
        ferrite_reactor::after(opts.period, move || tick(table, opts));
    } else if start {
        // Off the reactors (unit tests): no timer to run it.
        table.with(|t| t.borrow_mut().watchdog = false);
    }
}

/// Removes connection `id` from `table` (this reactor's).
pub fn unregister<T: Served>(table: &'static LocalKey<RefCell<ConnTable<T>>>, id: u64) {
    table.with(|t| t.borrow_mut().remove(id));
}

fn tick<T: Served>(table: &'static LocalKey<RefCell<ConnTable<T>>>, opts: WatchdogOptions) {
    let now = ferrite_reactor::tsc::ticks();
    // The connections in the table's scratch list (the table is released while they are
    // watched: closing one removes it).
    let mut conns = table.with(|t| {
        let mut t = t.borrow_mut();
        let mut v = std::mem::take(&mut t.scratch);
        v.extend(t.conns.values().cloned());
        v
    });
    for c in &conns {
        let core = c.core();
        if core.is_dead() {
            continue;
        }
        if core.handshake_overdue(now) {
            ferrite_reactor::log_limited!(
                log::Level::Warn,
                "{} connection {} from {}: handshake not finished in time; closing",
                opts.proto,
                core.id,
                core.peer
            );
            core.close();
        } else {
            c.watch(now);
        }
    }
    conns.clear();
    let any = table.with(|t| {
        let mut t = t.borrow_mut();
        t.scratch = conns;
        t.watchdog = !t.is_empty();
        t.watchdog
    });
    if any {
        ferrite_reactor::after(opts.period, move || tick(table, opts));
    }
}
