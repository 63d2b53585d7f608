//! The registry against the NVMe rules and SPDK's behaviour (its test_reservation_* unit tests).

use super::*;

fn host(n: u8) -> Initiator {
    Initiator::Nvme { hostid: [n; 16], hostnqn: format!("nqn.2014-08.org.nvmexpress:host{n}") }
}

const A: u64 = 0xa1;
const B: u64 = 0xb2;
const C: u64 = 0xc3;

/// Registry with hosts 1, 2, 3 registered with keys A, B, C.
fn three() -> Reservations {
    let r = Reservations::default();
    r.register(&host(1), A).unwrap();
    r.register(&host(2), B).unwrap();
    r.register(&host(3), C).unwrap();
    r
}

#[test]
fn identity_is_the_host_id_or_the_scsi_port() {
    let a = Initiator::Nvme { hostid: [1; 16], hostnqn: "x".into() };
    let b = Initiator::Nvme { hostid: [1; 16], hostnqn: "y".into() };
    assert_eq!(a, b, "the NQN is for logs only");
    let s1 = Initiator::Scsi { name: "iqn.a".into(), isid: [1; 6] };
    let s2 = Initiator::Scsi { name: "iqn.a".into(), isid: [2; 6] };
    assert_ne!(s1, s2);
    assert_ne!(a, s1);
}

#[test]
fn register_rules() {
    let r = Reservations::default();
    assert_eq!(r.register(&host(1), 0), Err(ResvError::Invalid("a zero reservation key cannot be registered")));
    r.register(&host(1), A).unwrap();
    assert_eq!(r.report().generation, 1);
    r.register(&host(1), A).expect("the same key again is not an error");
    assert_eq!(r.register(&host(1), B), Err(ResvError::Conflict));
    for i in 2..=MAX_REGISTRANTS as u8 {
        r.register(&host(i), u64::from(i)).unwrap();
    }
    assert_eq!(r.register(&host(200), 7), Err(ResvError::Full));
    assert_eq!(r.report().registrants.len(), MAX_REGISTRANTS);
}

#[test]
fn unregister_and_replace_rules() {
    let r = three();
    assert_eq!(r.unregister(&host(1), B, false), Err(ResvError::Conflict));
    assert_eq!(r.unregister(&host(9), A, false), Err(ResvError::Conflict));
    r.unregister(&host(1), 0, true).expect("IEKEY ignores the key");
    assert_eq!(r.report().registrants.len(), 2);

    assert_eq!(
        r.replace(&host(2), B, 0, false),
        Err(ResvError::Invalid("a zero reservation key cannot be registered"))
    );
    assert_eq!(r.replace(&host(2), A, 0x55, false), Err(ResvError::Conflict));
    r.replace(&host(2), B, 0x55, false).unwrap();
    r.replace(&host(2), 0, 0x66, true).unwrap();
    assert_eq!(r.replace(&host(1), 0, 0x77, false), Err(ResvError::Conflict), "not registered");
    r.replace(&host(1), 0, 0x77, true).expect("IEKEY registers a new one");
    let keys: Vec<u64> = r.report().registrants.iter().map(|x| x.key).collect();
    assert_eq!(keys, vec![0x66, C, 0x77]);
}

#[test]
fn replacing_the_holders_key_keeps_the_reservation() {
    let r = three();
    r.acquire(&host(1), A, ResvType::WriteExclusive).unwrap();
    r.replace(&host(1), A, 0x99, false).unwrap();
    let rep = r.report();
    assert_eq!((rep.rtype, rep.holder_key), (Some(ResvType::WriteExclusive), 0x99));
    assert_eq!(r.release(&host(1), 0x99, 1), Ok(vec![]));
}

#[test]
fn acquire_rules() {
    let r = three();
    assert_eq!(r.acquire(&host(1), B, ResvType::WriteExclusive), Err(ResvError::Conflict), "wrong key");
    assert_eq!(r.acquire(&host(9), A, ResvType::WriteExclusive), Err(ResvError::Conflict), "not registered");
    r.acquire(&host(1), A, ResvType::WriteExclusive).unwrap();
    assert!(r.is_held());
    r.acquire(&host(1), A, ResvType::WriteExclusive).expect("the holder again, same type");
    assert_eq!(r.acquire(&host(1), A, ResvType::ExclusiveAccess), Err(ResvError::Conflict), "another type");
    assert_eq!(r.acquire(&host(2), B, ResvType::WriteExclusive), Err(ResvError::Conflict), "held by another");
    let rep = r.report();
    assert_eq!(rep.holder_key, A);
    assert_eq!(rep.registrants.iter().filter(|x| x.holder).count(), 1);
}

#[test]
fn all_registrants_types_make_every_registrant_a_holder() {
    let r = three();
    r.acquire(&host(2), B, ResvType::WriteExclusiveAllRegs).unwrap();
    assert!(r.report().registrants.iter().all(|x| x.holder));
    r.acquire(&host(3), C, ResvType::WriteExclusiveAllRegs).expect("a holder too");
    // The reservation stays while any registrant does.
    r.unregister(&host(1), A, false).unwrap();
    r.unregister(&host(2), B, false).unwrap();
    assert!(r.is_held());
    r.unregister(&host(3), C, false).unwrap();
    assert!(!r.is_held());
}

#[test]
fn release_rules_and_notices() {
    let r = three();
    assert_eq!(r.release(&host(1), A, 1), Ok(vec![]), "nothing held: success");
    r.acquire(&host(1), A, ResvType::WriteExclusive).unwrap();
    assert_eq!(r.release(&host(1), B, 1), Err(ResvError::Conflict));
    assert_eq!(r.release(&host(9), A, 1), Err(ResvError::Conflict));
    assert!(matches!(r.release(&host(1), A, 2), Err(ResvError::Invalid(_))), "type mismatch");
    assert_eq!(r.release(&host(2), B, 1), Ok(vec![]), "not the holder: no change");
    assert!(r.is_held());
    assert_eq!(r.release(&host(1), A, 1), Ok(vec![]), "Write Exclusive: nobody is told");
    assert!(!r.is_held());
    r.acquire(&host(1), A, ResvType::WriteExclusiveRegOnly).unwrap();
    let n = r.release(&host(1), A, 3).unwrap();
    assert_eq!(n, vec![(host(2), Notice::ReservationReleased), (host(3), Notice::ReservationReleased)]);
}

#[test]
fn unregistering_the_holder_releases() {
    let r = three();
    r.acquire(&host(1), A, ResvType::ExclusiveAccessRegOnly).unwrap();
    let n = r.unregister(&host(1), A, false).unwrap();
    assert!(!r.is_held());
    assert_eq!(n, vec![(host(2), Notice::ReservationReleased), (host(3), Notice::ReservationReleased)]);
    let r = three();
    r.acquire(&host(1), A, ResvType::WriteExclusive).unwrap();
    assert_eq!(r.unregister(&host(1), A, false), Ok(vec![]), "not a registrants-only type");
    assert!(!r.is_held());
}

#[test]
fn clear_removes_everyone() {
    let r = three();
    r.acquire(&host(2), B, ResvType::ExclusiveAccess).unwrap();
    assert_eq!(r.clear(&host(1), B), Err(ResvError::Conflict));
    let g = r.report().generation;
    let n = r.clear(&host(1), A).unwrap();
    assert_eq!(n, vec![(host(2), Notice::RegistrationPreempted), (host(3), Notice::RegistrationPreempted)]);
    let rep = r.report();
    assert!(rep.registrants.is_empty() && rep.rtype.is_none());
    assert_eq!(rep.generation, g + 1);
    assert!(!r.is_held());
}

#[test]
fn preempt_the_holder() {
    let r = three();
    r.acquire(&host(1), A, ResvType::WriteExclusive).unwrap();
    assert_eq!(r.preempt(&host(2), A, A, ResvType::ExclusiveAccess), Err(ResvError::Conflict), "wrong CRKEY");
    assert_eq!(r.preempt(&host(2), B, 0, ResvType::ExclusiveAccess), Err(ResvError::Conflict), "PRKEY 0");
    let n = r.preempt(&host(2), B, A, ResvType::ExclusiveAccess).unwrap();
    assert_eq!(n, vec![(host(1), Notice::RegistrationPreempted), (host(3), Notice::ReservationReleased)]);
    let rep = r.report();
    assert_eq!((rep.rtype, rep.holder_key), (Some(ResvType::ExclusiveAccess), B));
    assert_eq!(rep.registrants.len(), 2);
    assert_eq!(r.check(&host(1), Access::Read), Err(ResvError::Conflict));
}

#[test]
fn preempt_a_registrant_that_does_not_hold() {
    let r = three();
    r.acquire(&host(1), A, ResvType::WriteExclusive).unwrap();
    let n = r.preempt(&host(2), B, C, ResvType::WriteExclusive).unwrap();
    assert_eq!(n, vec![(host(3), Notice::RegistrationPreempted)]);
    assert_eq!(r.report().holder_key, A, "the reservation stays");
}

#[test]
fn the_holder_preempts_itself_to_change_type() {
    let r = three();
    r.acquire(&host(1), A, ResvType::WriteExclusive).unwrap();
    let n = r.preempt(&host(1), A, A, ResvType::ExclusiveAccess).unwrap();
    assert_eq!(n, vec![(host(2), Notice::ReservationReleased), (host(3), Notice::ReservationReleased)]);
    assert_eq!(r.report().rtype, Some(ResvType::ExclusiveAccess));
    assert_eq!(r.report().registrants.len(), 3);
}

#[test]
fn preempt_without_a_reservation_unregisters_by_key() {
    let r = three();
    let n = r.preempt(&host(1), A, B, ResvType::WriteExclusive).unwrap();
    assert_eq!(n, vec![(host(2), Notice::RegistrationPreempted)]);
    assert!(!r.is_held(), "no reservation is taken");
}

#[test]
fn preempt_under_all_registrants() {
    let r = three();
    r.acquire(&host(1), A, ResvType::WriteExclusiveAllRegs).unwrap();
    assert_eq!(r.preempt(&host(2), B, 0x1234, ResvType::WriteExclusive), Err(ResvError::Conflict), "no such key");
    let n = r.preempt(&host(2), B, C, ResvType::WriteExclusive).unwrap();
    assert_eq!(n, vec![(host(3), Notice::RegistrationPreempted)]);
    assert_eq!(r.report().rtype, Some(ResvType::WriteExclusiveAllRegs));
    let n = r.preempt(&host(2), B, 0, ResvType::WriteExclusive).unwrap();
    assert_eq!(n, vec![(host(1), Notice::RegistrationPreempted)]);
    let rep = r.report();
    assert_eq!((rep.rtype, rep.holder_key, rep.registrants.len()), (Some(ResvType::WriteExclusive), B, 1));
}

/// Every type, for the holder, a registrant that does not hold, and a non-registrant:
/// (read allowed, write allowed), as NVMe 2.0's table and SPDK's check say.
#[test]
fn access_matrix() {
    use ResvType::*;
    #[rustfmt::skip]
    let table = [
        //                         holder          registrant       other
        (WriteExclusive,         [(true, true), (true, false), (true, false)]),
        (ExclusiveAccess,        [(true, true), (false, false), (false, false)]),
        (WriteExclusiveRegOnly,  [(true, true), (true, true), (true, false)]),
        (ExclusiveAccessRegOnly, [(true, true), (true, true), (false, false)]),
        (WriteExclusiveAllRegs,  [(true, true), (true, true), (true, false)]),
        (ExclusiveAccessAllRegs, [(true, true), (true, true), (false, false)]),
    ];
    for (t, expect) in table {
        let r = Reservations::default();
        r.register(&host(1), A).unwrap();
        r.register(&host(2), B).unwrap();
        r.acquire(&host(1), A, t).unwrap();
        for (who, (read, write)) in [host(1), host(2), host(3)].iter().zip(expect) {
            assert_eq!(r.check(who, Access::Read).is_ok(), read, "{t:?} read by {who}");
            assert_eq!(r.check(who, Access::Write).is_ok(), write, "{t:?} write by {who}");
        }
    }
    let r = Reservations::default();
    r.register(&host(1), A).unwrap();
    assert!(r.check(&host(2), Access::Write).is_ok(), "registered but nothing held: no restriction");
}

#[test]
fn restore_checks_the_holder() {
    let r = Reservations::default();
    let regs = vec![(host(1), A), (host(2), B)];
    assert!(r.restore(regs.clone(), Some(ResvType::WriteExclusive), Some(&host(9)), true).is_err());
    r.restore(regs, Some(ResvType::WriteExclusive), Some(&host(2)), true).unwrap();
    let rep = r.report();
    assert_eq!((rep.holder_key, rep.aptpl), (B, true));
    assert_eq!(r.check(&host(1), Access::Write), Err(ResvError::Conflict));
}

#[test]
fn interned_ids_follow_the_identity() {
    let a = Initiator::Nvme { hostid: [0x71; 16], hostnqn: "first".into() };
    let b = Initiator::Nvme { hostid: [0x71; 16], hostnqn: "second".into() };
    let s = Initiator::Scsi { name: "iqn.2016-06.io.ferrite:intern".into(), isid: [7; 6] };
    let t = Initiator::Scsi { name: "iqn.2016-06.io.ferrite:intern".into(), isid: [8; 6] };
    let (ra, rb, rs, rt) = (a.intern(), b.intern(), s.intern(), t.intern());
    assert_eq!(ra.id(), rb.id(), "the NQN is not part of the identity");
    assert_ne!(ra.id(), rs.id());
    assert_ne!(rs.id(), rt.id(), "another ISID is another initiator port");
    assert_eq!(rb.id().initiator(), Some(a.clone()), "the id gives the initiator back");
    assert_eq!(std::mem::size_of::<Option<InitiatorId>>(), 4);
    let id = ra.id();
    drop((ra, rb));
    assert_eq!(a.lookup(), None, "let go with its last hold");
    assert_eq!(id.initiator(), None);
    assert_eq!(s.lookup(), Some(rs.id()), "the others stay");
}

/// Hosts that connect with a new identity each time (hostile, or an initiator that makes up a
/// Host Identifier per run) do not grow the table: it holds what is held, and a number let go
/// comes back only after `REUSE_AFTER` others.
#[test]
fn interned_identities_are_bounded_by_what_is_held() {
    let held = Initiator::Scsi { name: "iqn.2016-06.io.ferrite:bound".into(), isid: [1; 6] }.intern();
    let before = super::interned();
    let mut seen = std::collections::HashSet::new();
    for i in 0..(3 * REUSE_AFTER as u32) {
        let mut hostid = [0xb0; 16];
        hostid[..4].copy_from_slice(&i.to_le_bytes());
        let r = Initiator::Nvme { hostid, hostnqn: format!("nqn.2014-08.org.example:{i}") }.intern();
        assert_ne!(r.id(), held.id());
        seen.insert(r.id());
        assert!(super::interned() <= before + 1 + 64, "the table holds only what is held (other tests run beside)");
    }
    assert!(seen.len() < 3 * REUSE_AFTER, "numbers let go are given out again: {} distinct", seen.len());
    assert_eq!(held.id().initiator().map(|w| matches!(w, Initiator::Scsi { .. })), Some(true));
}

#[test]
fn the_layer_check_by_id_is_the_access_matrix() {
    let r = three();
    r.acquire(&host(1), A, ResvType::WriteExclusiveRegOnly).unwrap();
    let stranger = host(9).intern();
    let (h1, h2) = (host(1).intern(), host(2).intern());
    assert_eq!(r.check_id(h1.id(), Access::Write), Ok(()));
    assert_eq!(r.check_id(h2.id(), Access::Write), Ok(()), "a registrant writes");
    assert_eq!(r.check_id(stranger.id(), Access::Write), Err(ResvError::Conflict));
    assert_eq!(r.check_id(stranger.id(), Access::Read), Ok(()));
    assert_eq!(r.check(&host(8), Access::Write), Err(ResvError::Conflict), "one never interned");
    r.release(&host(1), A, ResvType::WriteExclusiveRegOnly.code()).unwrap();
    assert_eq!(r.check_id(stranger.id(), Access::Write), Ok(()), "nothing held");
}

#[test]
fn request_types_map_to_the_access_the_nvme_opcodes_have() {
    use crate::IoType as T;
    for t in [T::Read, T::Compare] {
        assert_eq!(Access::of(t), Some(Access::Read), "{t:?}");
    }
    for t in [T::Write, T::WriteZeroes, T::Unmap, T::Flush, T::CompareAndWrite, T::Copy] {
        assert_eq!(Access::of(t), Some(Access::Write), "{t:?}");
    }
    for t in [T::Reset, T::Abort, T::NvmeIo, T::NvmeAdmin, T::SeekHole, T::SeekData] {
        assert_eq!(Access::of(t), None, "{t:?}");
    }
}

fn port(n: u8) -> Initiator {
    Initiator::Scsi { name: format!("iqn.2026-01.test:i{n}"), isid: [0, 0, 0, 0, 0, n] }
}

/// SCSI's REGISTER AND MOVE: only the holder of a reservation that is not all-registrants
/// moves it, to a registrant made or re-keyed, with the type kept.
#[test]
fn register_and_move_rules() {
    let r = Reservations::default();
    r.register(&port(1), A).unwrap();
    r.register(&port(2), B).unwrap();
    assert_eq!(r.register_and_move(&port(1), A, &port(3), C, false), Err(ResvError::Conflict), "nothing held");
    r.acquire(&port(1), A, ResvType::ExclusiveAccess).unwrap();
    assert_eq!(r.register_and_move(&port(2), B, &port(3), C, false), Err(ResvError::Conflict), "not the holder");
    assert_eq!(r.register_and_move(&port(1), B, &port(3), C, false), Err(ResvError::Conflict), "wrong key");
    assert!(matches!(r.register_and_move(&port(1), A, &port(3), 0, false), Err(ResvError::Invalid(_))));
    assert!(matches!(r.register_and_move(&port(1), A, &port(1), C, false), Err(ResvError::Invalid(_))));
    let g = r.report().generation;
    r.register_and_move(&port(1), A, &port(3), C, true).unwrap();
    let rep = r.report();
    assert_eq!((rep.rtype, rep.holder_key, rep.generation), (Some(ResvType::ExclusiveAccess), C, g));
    assert_eq!(rep.registrants.iter().map(|x| x.key).collect::<Vec<_>>(), vec![B, C], "the mover unregistered");
    assert_eq!(r.check(&port(3), Access::Write), Ok(()));
    assert_eq!(r.check(&port(1), Access::Read), Err(ResvError::Conflict));
    // Moving to a registrant replaces its key.
    r.register_and_move(&port(3), C, &port(2), 0x77, false).unwrap();
    let rep = r.report();
    assert_eq!(rep.holder_key, 0x77);
    assert_eq!(rep.registrants.len(), 2);
    r.release(&port(2), 0x77, ResvType::ExclusiveAccess.code()).unwrap();
    r.acquire(&port(2), 0x77, ResvType::WriteExclusiveAllRegs).unwrap();
    assert_eq!(r.register_and_move(&port(2), 0x77, &port(4), 9, false), Err(ResvError::Conflict), "all registrants");
}
