//! Persistent reservations of a bdev, shared by every target that exports it: who is registered
//! with which key, who holds the reservation and of which type, the generation counter and
//! Persist Through Power Loss. The operations are NVMe's Reservation Register, Acquire, Release
//! and Report (NVMe Base Specification 2.0, section 8.19), with SPDK's `nvmf_ns_reservation_*`
//! as the behaviour reference; SCSI persistent reservations use the same six types and the same
//! rules, so an iSCSI target shares this registry.
//!
//! The registry is behind a mutex (reservation commands are rare). The bdev layer checks every
//! request that carries an initiator ([`crate::IoRequest::initiator`], an [`InitiatorId`] a
//! target interned once per session) with [`Reservations::check_id`]: one relaxed atomic load
//! while no reservation is held; only with a reservation in place does it take the lock.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;

mod intern;
pub use intern::{interned, InitiatorId, InitiatorRef, REUSE_AFTER};
pub mod persist;

/// Most registrants of one bdev (SPDK's `SPDK_NVMF_MAX_NUM_REGISTRANTS`).
pub const MAX_REGISTRANTS: usize = 16;

/// Who sends a command: an NVMe host or a SCSI initiator port.
#[derive(Debug, Clone)]
pub enum Initiator {
    /// An NVMe host: its 128-bit Host Identifier (Connect's HOSTID) is the identity; the NQN
    /// is carried for log lines.
    Nvme {
        /// Host Identifier.
        hostid: [u8; 16],
        /// Host NQN (not part of the identity).
        hostnqn: String,
    },
    /// A SCSI initiator port: initiator name and ISID.
    Scsi {
        /// iSCSI initiator name.
        name: String,
        /// Initiator Session ID.
        isid: [u8; 6],
    },
}

impl PartialEq for Initiator {
    fn eq(&self, other: &Self) -> bool {
        match (self, other) {
            (Initiator::Nvme { hostid: a, .. }, Initiator::Nvme { hostid: b, .. }) => a == b,
            (Initiator::Scsi { name: a, isid: i }, Initiator::Scsi { name: b, isid: j }) => a == b && i == j,
            _ => false,
        }
    }
}

impl Eq for Initiator {}

impl std::fmt::Display for Initiator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Initiator::Nvme { hostid, hostnqn } => {
                write!(f, "host {} (", hostnqn.escape_debug())?;
                for b in hostid {
                    write!(f, "{b:02x}")?;
                }
                f.write_str(")")
            }
            Initiator::Scsi { name, isid } => {
                write!(f, "initiator {} isid ", name.escape_debug())?;
                for b in isid {
                    write!(f, "{b:02x}")?;
                }
                Ok(())
            }
        }
    }
}

/// A reservation type (NVMe RTYPE; SCSI PR types map onto the same six).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ResvType {
    /// Write Exclusive: only the holder writes.
    WriteExclusive = 1,
    /// Exclusive Access: only the holder reads or writes.
    ExclusiveAccess = 2,
    /// Write Exclusive - Registrants Only.
    WriteExclusiveRegOnly = 3,
    /// Exclusive Access - Registrants Only.
    ExclusiveAccessRegOnly = 4,
    /// Write Exclusive - All Registrants (every registrant is a holder).
    WriteExclusiveAllRegs = 5,
    /// Exclusive Access - All Registrants (every registrant is a holder).
    ExclusiveAccessAllRegs = 6,
}

impl ResvType {
    /// The type of NVMe code `v` (1..=6).
    pub fn from_code(v: u8) -> Option<ResvType> {
        Some(match v {
            1 => ResvType::WriteExclusive,
            2 => ResvType::ExclusiveAccess,
            3 => ResvType::WriteExclusiveRegOnly,
            4 => ResvType::ExclusiveAccessRegOnly,
            5 => ResvType::WriteExclusiveAllRegs,
            6 => ResvType::ExclusiveAccessAllRegs,
            _ => return None,
        })
    }

    /// The NVMe code.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// Every registrant holds the reservation.
    pub fn all_registrants(self) -> bool {
        matches!(self, ResvType::WriteExclusiveAllRegs | ResvType::ExclusiveAccessAllRegs)
    }

    /// Registrants that are not holders may write (and read).
    fn registrants_access(self) -> bool {
        !matches!(self, ResvType::WriteExclusive | ResvType::ExclusiveAccess)
    }

    /// Non-registrants may not read either.
    fn exclusive_access(self) -> bool {
        matches!(self, ResvType::ExclusiveAccess | ResvType::ExclusiveAccessRegOnly | ResvType::ExclusiveAccessAllRegs)
    }
}

/// What a command does to the medium, for the access matrix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Reads (Read, Compare, Verify).
    Read,
    /// Changes (Write, Write Zeroes, Dataset Management, Flush, Write Uncorrectable).
    Write,
}

impl Access {
    /// The access a bdev request of type `t` makes, as the NVMe target maps its opcodes: Read
    /// and Compare read; Write, Write Zeroes, Unmap (Dataset Management), Flush,
    /// Compare-and-Write and Copy write; the rest (reset, abort, passthrough, seeks) are not
    /// checked.
    #[inline]
    pub fn of(t: crate::IoType) -> Option<Access> {
        use crate::IoType as T;
        match t {
            T::Read | T::Compare => Some(Access::Read),
            T::Write | T::WriteZeroes | T::Unmap | T::Flush | T::CompareAndWrite | T::Copy => Some(Access::Write),
            T::Reset | T::Abort | T::NvmeIo | T::NvmeAdmin | T::SeekHole | T::SeekData => None,
        }
    }
}

/// Why an operation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResvError {
    /// Reservation Conflict: the key does not match, the initiator is not registered, or
    /// another holds the reservation.
    Conflict,
    /// A field of the command is invalid (the message says which).
    Invalid(&'static str),
    /// The registrant table is full ([`MAX_REGISTRANTS`]).
    Full,
}

impl std::fmt::Display for ResvError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ResvError::Conflict => f.write_str("reservation conflict"),
            ResvError::Invalid(m) => f.write_str(m),
            ResvError::Full => write!(f, "registrant table full ({MAX_REGISTRANTS})"),
        }
    }
}

/// A notice an operation owes another initiator (NVMe Reservation Notification log types).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Notice {
    /// Its registration was removed by a preempt or a clear.
    RegistrationPreempted = 1,
    /// The reservation it was part of was released.
    ReservationReleased = 2,
    /// The reservation it was part of was preempted.
    ReservationPreempted = 3,
}

/// Notices to deliver: each to the initiator named.
pub type Notices = Vec<(Initiator, Notice)>;

/// One registrant as a report shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registrant {
    /// Who.
    pub who: Initiator,
    /// Its reservation key.
    pub key: u64,
    /// It holds the reservation.
    pub holder: bool,
}

/// The registry's state as a report shows it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Report {
    /// Generation counter.
    pub generation: u32,
    /// The reservation held, if any.
    pub rtype: Option<ResvType>,
    /// Persist Through Power Loss is on.
    pub aptpl: bool,
    /// The reservation key of the holder (0 when none; SPDK's `crkey`).
    pub holder_key: u64,
    /// Registrants, in registration order.
    pub registrants: Vec<Registrant>,
}

/// A registrant: who (and a hold on its interned number) with which key.
struct Reg {
    who: Initiator,
    id: InitiatorRef,
    key: u64,
}

impl Reg {
    fn new(who: &Initiator, key: u64) -> Reg {
        Reg { who: who.clone(), id: who.intern(), key }
    }
}

#[derive(Default)]
struct State {
    /// Registrants, in registration order.
    regs: Vec<Reg>,
    /// Index in `regs` of the holder (for all-registrants types: the first registrant).
    holder: Option<usize>,
    rtype: Option<ResvType>,
    generation: u32,
    aptpl: bool,
}

impl State {
    fn find(&self, who: &Initiator) -> Option<usize> {
        self.regs.iter().position(|r| r.who == *who)
    }

    fn find_id(&self, id: InitiatorId) -> Option<usize> {
        self.regs.iter().position(|r| r.id.id() == id)
    }

    fn is_holder(&self, i: usize) -> bool {
        match self.rtype {
            Some(t) if t.all_registrants() => true,
            Some(_) => self.holder == Some(i),
            None => false,
        }
    }

    fn release(&mut self) {
        self.rtype = None;
        self.holder = None;
    }

    /// Removes registrant `i`; a holder leaving releases the reservation, except under an
    /// all-registrants type while registrants remain (SPDK's
    /// `nvmf_ns_reservation_check_release_on_remove_registrant`).
    fn remove(&mut self, i: usize) {
        self.regs.remove(i);
        match (self.rtype, self.holder) {
            (Some(t), Some(_)) if t.all_registrants() => {
                if self.regs.is_empty() {
                    self.release();
                } else {
                    self.holder = Some(0);
                }
            }
            (Some(_), Some(h)) if h == i => self.release(),
            (Some(_), Some(h)) if h > i => self.holder = Some(h - 1),
            _ => {}
        }
    }

    /// Removes every registrant but `keep` whose key is `key` (every one when `key` is None);
    /// returns how many.
    fn remove_where(&mut self, key: Option<u64>, keep: Option<usize>) -> usize {
        let keep_id = keep.map(|k| self.regs[k].id.id());
        let mut n = 0;
        let mut i = 0;
        while i < self.regs.len() {
            let mine = keep_id == Some(self.regs[i].id.id());
            if !mine && key.is_none_or(|k| self.regs[i].key == k) {
                self.remove(i);
                n += 1;
            } else {
                i += 1;
            }
        }
        n
    }

    fn others(&self, me: &Initiator) -> Vec<Initiator> {
        self.regs.iter().map(|r| &r.who).filter(|w| *w != me).cloned().collect()
    }

    fn bump(&mut self) {
        self.generation = self.generation.wrapping_add(1);
    }
}

/// A bdev's reservation registry ([`crate::Bdev::reservations`]).
#[derive(Default)]
pub struct Reservations {
    /// The reservation type held (0: none): what the per-I/O check reads without the lock.
    held: AtomicU8,
    state: Mutex<State>,
}

impl Reservations {
    fn locked(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn publish(&self, s: &State) {
        self.held.store(s.rtype.map_or(0, ResvType::code), Ordering::Release);
    }

    /// True while a reservation is held (one atomic load).
    pub fn is_held(&self) -> bool {
        self.held.load(Ordering::Relaxed) != 0
    }

    /// The access matrix (NVMe 2.0 figure "Command Behavior in the Presence of a
    /// Reservation", SPDK's `nvmf_ns_reservation_request_check`): Err(Conflict) if `who` may
    /// not do `access` now. One relaxed load when no reservation is held.
    pub fn check(&self, who: &Initiator, access: Access) -> Result<(), ResvError> {
        if self.held.load(Ordering::Relaxed) == 0 {
            return Ok(());
        }
        self.check_as(|s| s.find(who), access)
    }

    /// As [`Reservations::check`], for an interned initiator (what the bdev layer checks a
    /// stamped request with).
    pub fn check_id(&self, who: InitiatorId, access: Access) -> Result<(), ResvError> {
        if self.held.load(Ordering::Relaxed) == 0 {
            return Ok(());
        }
        self.check_as(|s| s.find_id(who), access)
    }

    /// The access matrix for the registrant `find` picks (None: not registered).
    fn check_as(&self, find: impl FnOnce(&State) -> Option<usize>, access: Access) -> Result<(), ResvError> {
        let s = self.locked();
        let Some(t) = s.rtype else { return Ok(()) };
        let me = find(&s);
        if me.is_some_and(|i| s.is_holder(i)) {
            return Ok(());
        }
        let registered = me.is_some();
        let allowed = match access {
            Access::Read => !t.exclusive_access() || (registered && t.registrants_access()),
            Access::Write => registered && t.registrants_access(),
        };
        if allowed {
            Ok(())
        } else {
            Err(ResvError::Conflict)
        }
    }

    /// Register (RREGA 000b): registers `who` with `nrkey`. Registering again with the same
    /// key succeeds; with another key it conflicts. A zero key is invalid.
    pub fn register(&self, who: &Initiator, nrkey: u64) -> Result<(), ResvError> {
        let mut s = self.locked();
        match s.find(who) {
            Some(i) if s.regs[i].key == nrkey => Ok(()),
            Some(_) => Err(ResvError::Conflict),
            None if nrkey == 0 => Err(ResvError::Invalid("a zero reservation key cannot be registered")),
            None if s.regs.len() >= MAX_REGISTRANTS => Err(ResvError::Full),
            None => {
                s.regs.push(Reg::new(who, nrkey));
                s.bump();
                Ok(())
            }
        }
    }

    /// Unregister (RREGA 001b): `crkey` must be `who`'s key unless `iekey`. A holder leaving
    /// releases the reservation; the other registrants are told when a registrants-only
    /// reservation goes with it.
    pub fn unregister(&self, who: &Initiator, crkey: u64, iekey: bool) -> Result<Notices, ResvError> {
        let mut s = self.locked();
        let Some(i) = s.find(who).filter(|&i| iekey || s.regs[i].key == crkey) else {
            return Err(ResvError::Conflict);
        };
        let before = s.rtype;
        let others = s.others(who);
        s.remove(i);
        s.bump();
        self.publish(&s);
        let released = s.rtype.is_none()
            && matches!(before, Some(ResvType::WriteExclusiveRegOnly | ResvType::ExclusiveAccessRegOnly));
        Ok(if released { others.into_iter().map(|w| (w, Notice::ReservationReleased)).collect() } else { vec![] })
    }

    /// Replace (RREGA 010b): `who`'s key becomes `nrkey` (`crkey` must match unless `iekey`;
    /// with `iekey`, an unregistered initiator is registered).
    pub fn replace(&self, who: &Initiator, crkey: u64, nrkey: u64, iekey: bool) -> Result<(), ResvError> {
        if nrkey == 0 {
            return Err(ResvError::Invalid("a zero reservation key cannot be registered"));
        }
        let mut s = self.locked();
        match s.find(who) {
            Some(i) if !iekey && s.regs[i].key != crkey => Err(ResvError::Conflict),
            Some(i) => {
                s.regs[i].key = nrkey;
                s.bump();
                Ok(())
            }
            None if !iekey => Err(ResvError::Conflict),
            None if s.regs.len() >= MAX_REGISTRANTS => Err(ResvError::Full),
            None => {
                s.regs.push(Reg::new(who, nrkey));
                s.bump();
                Ok(())
            }
        }
    }

    /// Acquire (RACQA 000b): `who` (registered with `crkey`) takes a reservation of type
    /// `rtype`. Acquiring what it holds again succeeds; a reservation held by another, or of
    /// another type, conflicts.
    pub fn acquire(&self, who: &Initiator, crkey: u64, rtype: ResvType) -> Result<(), ResvError> {
        let mut s = self.locked();
        let i = s.find(who).filter(|&i| s.regs[i].key == crkey).ok_or(ResvError::Conflict)?;
        if s.is_holder(i) && s.rtype == Some(rtype) {
            return Ok(());
        }
        if s.rtype.is_some() {
            return Err(ResvError::Conflict);
        }
        s.rtype = Some(rtype);
        s.holder = Some(if rtype.all_registrants() { 0 } else { i });
        self.publish(&s);
        Ok(())
    }

    /// Preempt (RACQA 001b) and Preempt and Abort (010b; the abort of the preempted hosts'
    /// commands is the caller's): removes the registrants with key `prkey` and, when they held
    /// the reservation, gives it to `who` with type `rtype` (SPDK's rules, including a holder
    /// preempting itself to change type, and PRKEY 0 under all-registrants types removing
    /// every other registrant). Returns the notices owed.
    pub fn preempt(&self, who: &Initiator, crkey: u64, prkey: u64, rtype: ResvType) -> Result<Notices, ResvError> {
        let mut s = self.locked();
        let me = s.find(who).filter(|&i| s.regs[i].key == crkey).ok_or(ResvError::Conflict)?;
        let before = s.others(who);
        let mut released = false;
        match s.rtype {
            None => {
                // No reservation: unregister those with PRKEY (not `who`).
                s.remove_where(Some(prkey), Some(me));
            }
            Some(t) if !t.all_registrants() => {
                let holder_key = s.holder.map(|h| s.regs[h].key);
                if s.is_holder(me) && holder_key == Some(prkey) {
                    // The holder preempts itself: the type changes.
                    s.rtype = Some(rtype);
                    released = true;
                } else if holder_key == Some(prkey) {
                    s.remove_where(Some(prkey), Some(me));
                    let me = s.find(who).expect("kept");
                    s.release();
                    s.rtype = Some(rtype);
                    s.holder = Some(if rtype.all_registrants() { 0 } else { me });
                    released = true;
                } else if prkey != 0 {
                    s.remove_where(Some(prkey), Some(me));
                } else {
                    return Err(ResvError::Conflict);
                }
            }
            Some(_) => {
                if prkey == 0 {
                    s.remove_where(None, Some(me));
                    let me = s.find(who).expect("kept");
                    s.rtype = Some(rtype);
                    s.holder = Some(if rtype.all_registrants() { 0 } else { me });
                    released = true;
                } else if s.remove_where(Some(prkey), Some(me)) == 0 {
                    return Err(ResvError::Conflict);
                }
            }
        }
        s.bump();
        self.publish(&s);
        let after = s.others(who);
        let mut notices: Notices =
            before.into_iter().filter(|w| !after.contains(w)).map(|w| (w, Notice::RegistrationPreempted)).collect();
        if released {
            notices.extend(after.into_iter().map(|w| (w, Notice::ReservationReleased)));
        }
        Ok(notices)
    }

    /// Release (RRELA 000b): the holder (registered with `crkey`) gives up the reservation,
    /// whose type must be `rtype`. A registrant that does not hold it, or no reservation,
    /// succeeds without change. The other registrants are told unless the type was Write
    /// Exclusive or Exclusive Access.
    pub fn release(&self, who: &Initiator, crkey: u64, rtype: u8) -> Result<Notices, ResvError> {
        let mut s = self.locked();
        let i = s.find(who).filter(|&i| s.regs[i].key == crkey).ok_or(ResvError::Conflict)?;
        let Some(t) = s.rtype else { return Ok(vec![]) };
        if t.code() != rtype {
            return Err(ResvError::Invalid("the reservation type does not match the reservation held"));
        }
        if !s.is_holder(i) {
            return Ok(vec![]);
        }
        let others = s.others(who);
        s.release();
        self.publish(&s);
        Ok(if t.registrants_access() {
            others.into_iter().map(|w| (w, Notice::ReservationReleased)).collect()
        } else {
            vec![]
        })
    }

    /// Clear (RRELA 001b): `who` (registered with `crkey`) releases the reservation and
    /// removes every registrant; the others are told their registration was preempted.
    pub fn clear(&self, who: &Initiator, crkey: u64) -> Result<Notices, ResvError> {
        let mut s = self.locked();
        s.find(who).filter(|&i| s.regs[i].key == crkey).ok_or(ResvError::Conflict)?;
        let others = s.others(who);
        s.regs.clear();
        s.release();
        s.bump();
        self.publish(&s);
        Ok(others.into_iter().map(|w| (w, Notice::RegistrationPreempted)).collect())
    }

    /// SCSI REGISTER AND MOVE (SPC-4 5.12.11.6): the holder `who` (registered with `crkey`)
    /// registers `to` with `sa_key` (replacing its key if it is registered) and hands it the
    /// reservation, keeping the type; with `unreg`, `who` is unregistered afterwards. NVMe has
    /// no such operation. Conflict unless `who` holds a reservation of a type that is not
    /// all-registrants; invalid if `sa_key` is zero or `to` is `who`. The generation does not
    /// move (SPC-4 6.16.2).
    pub fn register_and_move(
        &self,
        who: &Initiator,
        crkey: u64,
        to: &Initiator,
        sa_key: u64,
        unreg: bool,
    ) -> Result<(), ResvError> {
        let mut s = self.locked();
        let me = s.find(who).filter(|&i| s.regs[i].key == crkey).ok_or(ResvError::Conflict)?;
        match s.rtype {
            Some(t) if !t.all_registrants() && s.holder == Some(me) => {}
            _ => return Err(ResvError::Conflict),
        }
        if sa_key == 0 {
            return Err(ResvError::Invalid("a zero reservation key cannot be registered"));
        }
        if to == who {
            return Err(ResvError::Invalid("a reservation cannot be moved to its holder"));
        }
        let dest = match s.find(to) {
            Some(i) => {
                s.regs[i].key = sa_key;
                i
            }
            None if s.regs.len() >= MAX_REGISTRANTS => return Err(ResvError::Full),
            None => {
                s.regs.push(Reg::new(to, sa_key));
                s.regs.len() - 1
            }
        };
        s.holder = Some(dest);
        if unreg {
            let me = s.find(who).expect("still registered");
            s.regs.remove(me);
            if dest > me {
                s.holder = Some(dest - 1);
            }
        }
        debug_assert!(s.holder.is_some_and(|h| s.regs[h].who == *to), "the reservation moved to its new holder");
        self.publish(&s);
        Ok(())
    }

    /// Persist Through Power Loss on or off (the caller keeps a persistent copy).
    pub fn set_aptpl(&self, on: bool) {
        self.locked().aptpl = on;
    }

    /// The state, for a report (and for a persistent copy).
    pub fn report(&self) -> Report {
        let s = self.locked();
        Report {
            generation: s.generation,
            rtype: s.rtype,
            aptpl: s.aptpl,
            holder_key: match (s.rtype, s.holder) {
                (Some(_), Some(h)) => s.regs.get(h).map_or(0, |r| r.key),
                _ => 0,
            },
            registrants: s
                .regs
                .iter()
                .enumerate()
                .map(|(i, r)| Registrant { who: r.who.clone(), key: r.key, holder: s.is_holder(i) })
                .collect(),
        }
    }

    /// Restores a persisted state (Persist Through Power Loss): the registrants, and the
    /// reservation held by `holder` (any registrant for an all-registrants type). Fails if
    /// there are too many registrants or the holder is not one of them.
    pub fn restore(
        &self,
        regs: Vec<(Initiator, u64)>,
        rtype: Option<ResvType>,
        holder: Option<&Initiator>,
        aptpl: bool,
    ) -> Result<(), ResvError> {
        if regs.len() > MAX_REGISTRANTS {
            return Err(ResvError::Full);
        }
        let holder = match rtype {
            None => None,
            Some(t) if t.all_registrants() && !regs.is_empty() => Some(0),
            Some(_) => Some(
                holder
                    .and_then(|h| regs.iter().position(|(w, _)| w == h))
                    .ok_or(ResvError::Invalid("the holder is not a registrant"))?,
            ),
        };
        let mut s = self.locked();
        s.regs = regs.iter().map(|(w, k)| Reg::new(w, *k)).collect();
        s.rtype = if holder.is_some() { rtype } else { None };
        s.holder = holder;
        s.aptpl = aptpl;
        self.publish(&s);
        Ok(())
    }
}

#[cfg(test)]
mod tests;
