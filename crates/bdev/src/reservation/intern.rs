//! Initiator identities as small numbers: a target interns its initiator once per session (an
//! NVMe controller, a SCSI I_T nexus) and stamps each request with the number, so the bdev
//! layer checks reservations without allocating, hashing or comparing strings per I/O.
//!
//! Numbers are never reused: the table only grows, by one entry per distinct identity (an NVMe
//! Host Identifier, a SCSI initiator name and ISID) the process has seen.

use super::Initiator;
use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Mutex, OnceLock};

/// An interned [`Initiator`]: equal identities get equal ids, in every bdev. `Copy`, four
/// bytes; `Option<InitiatorId>` is four bytes too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InitiatorId(NonZeroU32);

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

#[derive(Default)]
struct Table {
    ids: HashMap<Key, InitiatorId>,
    /// By id - 1: the initiator as first interned (for log lines).
    who: Vec<Initiator>,
}

fn table() -> std::sync::MutexGuard<'static, Table> {
    static T: OnceLock<Mutex<Table>> = OnceLock::new();
    T.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner())
}

impl Initiator {
    /// This identity's id (the same for every equal initiator). Takes a process-wide lock:
    /// call it once per session, not per I/O.
    pub fn intern(&self) -> InitiatorId {
        let mut t = table();
        let key = Key::of(self);
        if let Some(&id) = t.ids.get(&key) {
            return id;
        }
        let n = u32::try_from(t.who.len() + 1).expect("fewer than 2^32 initiators");
        let id = InitiatorId(NonZeroU32::new(n).expect("ids start at 1"));
        t.who.push(self.clone());
        t.ids.insert(key, id);
        debug_assert_eq!(t.who.len(), t.ids.len(), "one entry per identity");
        id
    }
}

impl InitiatorId {
    /// The initiator it stands for (as first interned: an NVMe host's NQN is the first seen).
    pub fn initiator(self) -> Initiator {
        table().who[self.0.get() as usize - 1].clone()
    }

    /// The number.
    pub fn get(self) -> u32 {
        self.0.get()
    }
}

impl std::fmt::Display for InitiatorId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.initiator().fmt(f)
    }
}
