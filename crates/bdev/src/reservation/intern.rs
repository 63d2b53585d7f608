//! Initiator identities as small numbers: a target interns its initiator once per session (an
//! NVMe controller, a SCSI I_T nexus) and stamps each request with the number, so the bdev
//! layer checks reservations without allocating, hashing or comparing strings per I/O.
//!
//! An identity stays interned while something holds an [`InitiatorRef`] of it (a session, a
//! registrant of some bdev): the table holds what is live, not every host the process has
//! seen, so hosts that connect with a new identity each time cannot grow it without bound.
//! A number that is let go is reused only after [`REUSE_AFTER`] others were let go since, so a
//! request stamped by a session that just ended is never taken for a new identity's.

use super::Initiator;
use std::collections::{HashMap, VecDeque};
use std::num::NonZeroU32;
use std::sync::{Mutex, OnceLock};

/// Numbers let go wait behind this many others before they are given out again.
pub const REUSE_AFTER: usize = 1024;

/// An interned [`Initiator`]'s number, what a request carries: equal identities have equal
/// numbers, in every bdev, while interned. `Copy`, four bytes; `Option<InitiatorId>` is four
/// bytes too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InitiatorId(NonZeroU32);

/// A hold on an interned identity: while one exists its number stands for it. Cloning takes
/// another hold; the last one dropped lets the number go.
#[derive(Debug, PartialEq, Eq)]
pub struct InitiatorRef(InitiatorId);

/// What makes an identity (the NQN is not part of it).
#[derive(PartialEq, Eq, Hash)]
enum Key {
    Nvme([u8; 16]),
    Scsi(String, [u8; 6]),
}

impl Key {
    fn of(who: &Initiator) -> Key {
        match who {
            Initiator::Nvme { hostid, .. } => Key::Nvme(*hostid),
            Initiator::Scsi { name, isid } => Key::Scsi(name.clone(), *isid),
        }
    }
}

/// One interned identity.
struct Entry {
    /// The initiator as first interned (for log lines).
    who: Initiator,
    /// Holds ([`InitiatorRef`]s) of it.
    refs: u64,
}

#[derive(Default)]
struct Table {
    ids: HashMap<Key, InitiatorId>,
    /// By number - 1: the identity, while interned.
    entries: Vec<Option<Entry>>,
    /// Numbers let go, oldest first.
    free: VecDeque<NonZeroU32>,
}

impl Table {
    fn entry(&mut self, id: InitiatorId) -> &mut Entry {
        self.entries[id.0.get() as usize - 1].as_mut().expect("a held number is interned")
    }

    /// A number for a new identity: a let-go one that waited long enough, or the next.
    fn next_number(&mut self) -> NonZeroU32 {
        if self.free.len() > REUSE_AFTER {
            return self.free.pop_front().expect("the queue is longer than REUSE_AFTER");
        }
        self.entries.push(None);
        NonZeroU32::new(u32::try_from(self.entries.len()).expect("fewer than 2^32 live initiators"))
            .expect("numbers start at 1")
    }

    fn check(&self) {
        debug_assert_eq!(self.ids.len(), self.entries.iter().filter(|e| e.is_some()).count(), "one entry per identity");
        debug_assert_eq!(self.ids.len() + self.free.len(), self.entries.len(), "every number interned or free");
    }
}

fn table() -> std::sync::MutexGuard<'static, Table> {
    static T: OnceLock<Mutex<Table>> = OnceLock::new();
    T.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner())
}

impl Initiator {
    /// A hold on this identity's number (the same for every equal initiator while interned).
    /// Takes a process-wide lock: call it once per session, not per I/O.
    pub fn intern(&self) -> InitiatorRef {
        let mut t = table();
        let key = Key::of(self);
        if let Some(&id) = t.ids.get(&key) {
            t.entry(id).refs += 1;
            return InitiatorRef(id);
        }
        let n = t.next_number();
        let id = InitiatorId(n);
        t.entries[n.get() as usize - 1] = Some(Entry { who: self.clone(), refs: 1 });
        t.ids.insert(key, id);
        t.check();
        InitiatorRef(id)
    }

    /// This identity's number if it is interned (something holds it), without taking a hold.
    pub fn lookup(&self) -> Option<InitiatorId> {
        table().ids.get(&Key::of(self)).copied()
    }
}

impl InitiatorRef {
    /// The number requests carry.
    #[inline]
    pub fn id(&self) -> InitiatorId {
        self.0
    }
}

impl Clone for InitiatorRef {
    fn clone(&self) -> Self {
        table().entry(self.0).refs += 1;
        InitiatorRef(self.0)
    }
}

impl Drop for InitiatorRef {
    fn drop(&mut self) {
        let mut t = table();
        let e = t.entry(self.0);
        e.refs -= 1;
        if e.refs > 0 {
            return;
        }
        let gone = t.entries[self.0 .0.get() as usize - 1].take().expect("interned");
        t.ids.remove(&Key::of(&gone.who));
        t.free.push_back(self.0 .0);
        t.check();
    }
}

impl InitiatorId {
    /// The initiator it stands for (as first interned: an NVMe host's NQN is the first seen),
    /// if it is still interned.
    pub fn initiator(self) -> Option<Initiator> {
        table().entries.get(self.0.get() as usize - 1)?.as_ref().map(|e| e.who.clone())
    }

    /// The number.
    pub fn get(self) -> u32 {
        self.0.get()
    }
}

impl std::fmt::Display for InitiatorId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.initiator() {
            Some(who) => who.fmt(f),
            None => write!(f, "initiator #{} (gone)", self.0),
        }
    }
}

/// How many identities are interned now (for tests of the bound).
pub fn interned() -> usize {
    table().ids.len()
}
