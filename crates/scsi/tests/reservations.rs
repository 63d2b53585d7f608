//! Persistent reservations (register, reserve of each type, preempt, clear, release, the
//! reports, REGISTER AND MOVE, APTPL across a restart) and SPC-2 RESERVE/RELEASE, with two
//! and three I_T nexuses.

mod common;

use common::*;
use ferrite_scsi::cdb::op;
use ferrite_scsi::Session;

const BS: u32 = 512;
const RC: (u8, u8, u8, u8) = (0x18, 0, 0, 0);

async fn prout(s: &Session, sa: u8, rtype: u8, key: u64, sa_key: u64, flags: u8) -> (u8, u8, u8, u8) {
    let mut p = vec![0u8; 24];
    p[0..8].copy_from_slice(&key.to_be_bytes());
    p[8..16].copy_from_slice(&sa_key.to_be_bytes());
    p[20] = flags;
    let c = [op::PERSISTENT_RESERVE_OUT, sa, rtype, 0, 0, 0, 0, 0, 24, 0];
    outcome(&cmd(s, &c, 24, Some(&p)).await)
}

async fn prin(s: &Session, sa: u8) -> Vec<u8> {
    let r = cmd(s, &[op::PERSISTENT_RESERVE_IN, sa, 0, 0, 0, 0, 0, 0x10, 0, 0], 4096, None).await;
    assert_eq!(outcome(&r), GOOD);
    data(&r)
}

fn keys(d: &[u8]) -> Vec<u64> {
    d[8..].chunks(8).map(|c| u64::from_be_bytes(c.try_into().unwrap())).collect()
}

async fn read_ok(s: &Session) -> bool {
    outcome(&cmd(s, &cdb10(op::READ_10, 0, 0, 1), BS, None).await) == GOOD
}

async fn write_ok(s: &Session) -> bool {
    outcome(&cmd(s, &cdb10(op::WRITE_10, 0, 0, 1), BS, Some(&[1; 512])).await) == GOOD
}

async fn tur(s: &Session) -> (u8, u8, u8, u8) {
    outcome(&cmd(s, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None).await)
}

#[test]
fn register_reserve_and_the_access_of_each_type() {
    let e = engine(1);
    let t = target("pr_types", 256, BS);
    run(&e, 0, move || async move {
        let (a, b, c) = (session(&t, 1), session(&t, 2), session(&t, 3));
        // REGISTER: a new key needs a zero RESERVATION KEY; READ KEYS shows it.
        assert_eq!(prout(&a, 0, 0, 5, 0xa, 0).await, RC);
        assert_eq!(prout(&a, 0, 0, 0, 0xa, 0).await, GOOD);
        assert_eq!(prout(&b, 6, 0, 0, 0xb, 0).await, GOOD, "REGISTER AND IGNORE EXISTING KEY");
        let k = prin(&a, 0).await;
        assert_eq!((u32::from_be_bytes(k[0..4].try_into().unwrap()), keys(&k)), (2, vec![0xa, 0xb]));
        // Registering again with another key conflicts; REPLACE goes through the old key.
        assert_eq!(prout(&a, 0, 0, 0, 0xaa, 0).await, RC);
        assert_eq!(prout(&a, 0, 0, 0xa, 0xa1, 0).await, GOOD);
        assert_eq!(prout(&a, 0, 0, 0xa1, 0xa, 0).await, GOOD);
        // (a holder, b registrant, c neither): may read, may write.
        #[rustfmt::skip]
        let table = [
            (1, [(true, true), (true, false), (true, false)]),
            (3, [(true, true), (false, false), (false, false)]),
            (5, [(true, true), (true, true), (true, false)]),
            (6, [(true, true), (true, true), (false, false)]),
            (7, [(true, true), (true, true), (true, false)]),
            (8, [(true, true), (true, true), (false, false)]),
        ];
        for (ty, expect) in table {
            assert_eq!(prout(&a, 1, ty, 0xa, 0, 0).await, GOOD, "reserve type {ty}");
            assert_eq!(prout(&a, 1, ty, 0xa, 0, 0).await, GOOD, "the holder again");
            assert_eq!(prout(&b, 1, if ty == 1 { 3 } else { 1 }, 0xb, 0, 0).await, RC, "another reserve");
            let r = prin(&c, 1).await;
            assert_eq!(u32::from_be_bytes(r[4..8].try_into().unwrap()), 16);
            let holder_key = u64::from_be_bytes(r[8..16].try_into().unwrap());
            assert_eq!(holder_key, if ty >= 7 { 0 } else { 0xa }, "all-registrants report key 0");
            assert_eq!(r[21] & 0x0f, ty);
            for (s, (rd, wr)) in [&a, &b, &c].into_iter().zip(expect) {
                assert_eq!((read_ok(s).await, write_ok(s).await), (rd, wr), "type {ty}");
            }
            // TEST UNIT READY and INQUIRY are never refused.
            assert_eq!(tur(&c).await, GOOD);
            // Releasing with the wrong type; then right.
            let other = if ty == 1 { 3 } else { 1 };
            let rel = prout(&a, 2, other, 0xa, 0, 0).await;
            assert_eq!(rel, check(5, 0x26, 0x04), "INVALID RELEASE OF PERSISTENT RESERVATION");
            assert_eq!(prout(&c, 2, ty, 0xc, 0, 0).await, RC, "not registered");
            assert_eq!(prout(&a, 2, ty, 0xa, 0, 0).await, GOOD);
            // Registrants-only and all-registrants types tell the others when released.
            let b_ua = tur(&b).await;
            if matches!(ty, 5..=8) {
                assert_eq!(b_ua, check(6, 0x2a, 0x04), "RESERVATIONS RELEASED, type {ty}");
            } else {
                assert_eq!(b_ua, GOOD);
            }
        }
        // The reservation fields: a scope other than LU and an unknown type.
        assert_eq!(prout(&a, 1, 0x11, 0xa, 0, 0).await, check(5, 0x24, 0));
        assert_eq!(prout(&a, 1, 2, 0xa, 0, 0).await, check(5, 0x24, 0));
        // ALL_TG_PT and SPEC_I_PT are not supported; APTPL needs an aptpl_file.
        assert_eq!(prout(&c, 0, 0, 0, 0xc, 0x04).await, check(5, 0x26, 0));
        assert_eq!(prout(&c, 0, 0, 0, 0xc, 0x08).await, check(5, 0x26, 0));
        assert_eq!(prout(&c, 0, 0, 0, 0xc, 0x01).await, check(5, 0x26, 0));
        // REPORT CAPABILITIES.
        let caps = prin(&a, 2).await;
        assert_eq!(caps, vec![0, 8, 0x10, 0x80, 0xea, 0x01, 0, 0]);
        // Unregister: READ KEYS shrinks.
        assert_eq!(prout(&b, 0, 0, 0xb, 0, 0).await, GOOD);
        assert_eq!(keys(&prin(&a, 0).await), vec![0xa]);
        // A short parameter list.
        let c10 = [op::PERSISTENT_RESERVE_OUT, 0, 0, 0, 0, 0, 0, 0, 20, 0];
        assert_eq!(outcome(&cmd(&a, &c10, 20, Some(&[0; 20])).await), check(5, 0x1a, 0));
        // Service actions 4-31 of PERSISTENT RESERVE IN are invalid.
        let r = cmd(&a, &[op::PERSISTENT_RESERVE_IN, 4, 0, 0, 0, 0, 0, 0x10, 0, 0], 4096, None).await;
        assert_eq!(outcome(&r), check(5, 0x24, 0));
    });
    e.stop();
    e.join();
}

#[test]
fn preempt_clear_full_status_and_move() {
    let e = engine(1);
    let t = target("pr_preempt", 256, BS);
    run(&e, 0, move || async move {
        let (a, b, c) = (session(&t, 1), session(&t, 2), session(&t, 3));
        for (s, k) in [(&a, 0xa), (&b, 0xb), (&c, 0xc)] {
            assert_eq!(prout(s, 0, 0, 0, k, 0).await, GOOD);
        }
        assert_eq!(prout(&a, 1, 3, 0xa, 0, 0).await, GOOD);
        // READ FULL STATUS: every registrant with its TransportID; the holder marked.
        let fs = prin(&c, 3).await;
        let mut at = 8;
        let mut seen = vec![];
        while at < fs.len() {
            let key = u64::from_be_bytes(fs[at..at + 8].try_into().unwrap());
            let holder = fs[at + 12] & 1 != 0;
            let n = u32::from_be_bytes(fs[at + 20..at + 24].try_into().unwrap()) as usize;
            let tid = &fs[at + 24..at + 24 + n];
            assert!(ferrite_scsi::pr::parse_transport_id(tid).is_some());
            seen.push((key, holder, fs[at + 13] & 0x0f));
            at += 24 + n;
        }
        assert_eq!(seen, vec![(0xa, true, 3), (0xb, false, 0), (0xc, false, 0)]);
        // Preempting a key nobody has conflicts; a zero key is invalid here.
        assert_eq!(prout(&b, 4, 3, 0xb, 0x99, 0).await, RC);
        assert_eq!(prout(&b, 4, 3, 0xb, 0, 0).await, check(5, 0x26, 0));
        // b preempts the holder a and takes the reservation as Write Exclusive.
        assert_eq!(prout(&b, 4, 1, 0xb, 0xa, 0).await, GOOD);
        assert_eq!(tur(&a).await, check(6, 0x2a, 0x05), "REGISTRATIONS PREEMPTED");
        assert_eq!(tur(&c).await, check(6, 0x2a, 0x04), "the type changed: RESERVATIONS RELEASED");
        assert_eq!(keys(&prin(&c, 0).await), vec![0xb, 0xc]);
        let r = prin(&c, 1).await;
        assert_eq!((u64::from_be_bytes(r[8..16].try_into().unwrap()), r[21]), (0xb, 1));
        assert!(!write_ok(&a).await && read_ok(&a).await);
        // PREEMPT AND ABORT of c's registration.
        assert_eq!(prout(&b, 5, 1, 0xb, 0xc, 0).await, GOOD);
        assert_eq!(tur(&c).await, check(6, 0x2a, 0x05));
        // REGISTER AND MOVE to a (not registered now), through port 2; b unregisters.
        let tid = ferrite_scsi::pr::transport_id(&initiator(1)).unwrap();
        let mut p = vec![0u8; 24];
        p[0..8].copy_from_slice(&0xbu64.to_be_bytes());
        p[8..16].copy_from_slice(&0xa2u64.to_be_bytes());
        p[17] = 0x02;
        p[18..20].copy_from_slice(&2u16.to_be_bytes());
        p[20..24].copy_from_slice(&(tid.len() as u32).to_be_bytes());
        p.extend_from_slice(&tid);
        let mut c10 = vec![op::PERSISTENT_RESERVE_OUT, 7, 0, 0, 0, 0, 0, 0, 0, 0];
        c10[7..9].copy_from_slice(&(p.len() as u16).to_be_bytes());
        assert_eq!(outcome(&cmd(&b, &c10, p.len() as u32, Some(&p)).await), GOOD);
        assert_eq!(keys(&prin(&c, 0).await), vec![0xa2]);
        let r = prin(&c, 1).await;
        assert_eq!((u64::from_be_bytes(r[8..16].try_into().unwrap()), r[21]), (0xa2, 1));
        assert!(write_ok(&a).await && !write_ok(&b).await);
        // CLEAR: everyone's gone; the others hear RESERVATIONS PREEMPTED.
        assert_eq!(prout(&b, 0, 0, 0, 0xb, 0).await, GOOD);
        assert_eq!(prout(&a, 3, 0, 0xa2, 0, 0).await, GOOD);
        assert_eq!(tur(&b).await, check(6, 0x2a, 0x03));
        assert_eq!(tur(&a).await, GOOD);
        assert!(keys(&prin(&c, 0).await).is_empty());
        assert_eq!(prin(&c, 1).await[4..8], [0, 0, 0, 0]);
    });
    e.stop();
    e.join();
}

#[test]
fn spc2_reserve_and_release() {
    let e = engine(1);
    let t = target("pr_spc2", 256, BS);
    run(&e, 0, move || async move {
        let (a, b) = (session(&t, 1), session(&t, 2));
        let reserve = [op::RESERVE_6, 0, 0, 0, 0, 0];
        let release = [op::RELEASE_6, 0, 0, 0, 0, 0];
        let msense = [op::MODE_SENSE_6, 0, 0x3f, 0, 255, 0];
        assert_eq!(outcome(&cmd(&a, &reserve, 0, None).await), GOOD);
        assert_eq!(outcome(&cmd(&a, &reserve, 0, None).await), GOOD, "the holder again");
        assert_eq!(outcome(&cmd(&b, &reserve, 0, None).await), RC);
        assert_eq!(outcome(&cmd(&b, &release, 0, None).await), GOOD, "not the holder: nothing happens");
        assert_eq!(outcome(&cmd(&a, &msense, 255, None).await), GOOD);
        assert_eq!(outcome(&cmd(&b, &msense, 255, None).await), RC);
        assert_eq!(outcome(&cmd(&b, &[op::INQUIRY, 0, 0, 0, 96, 0], 96, None).await), GOOD);
        assert!(!read_ok(&b).await);
        assert_eq!(outcome(&cmd(&a, &release, 0, None).await), GOOD);
        assert_eq!(outcome(&cmd(&b, &[op::RESERVE_10, 0, 0, 0, 0, 0, 0, 0, 0, 0], 0, None).await), GOOD);
        // The holder's nexus ends: the reservation goes with it.
        drop(b);
        assert_eq!(outcome(&cmd(&a, &reserve, 0, None).await), GOOD);
        // A logical unit reset releases it too.
        assert_eq!(a.lun_reset(0).await, ferrite_scsi::TmfResponse::Complete);
        let b = session(&t, 2);
        assert_eq!(outcome(&cmd(&b, &reserve, 0, None).await), GOOD);
        assert_eq!(outcome(&cmd(&b, &release, 0, None).await), GOOD);
        // With a registration in place RESERVE and RELEASE conflict (CRH).
        assert_eq!(prout(&a, 0, 0, 0, 0xa, 0).await, check(6, 0x29, 0x03), "the reset's unit attention first");
        assert_eq!(prout(&a, 0, 0, 0, 0xa, 0).await, GOOD);
        assert_eq!(outcome(&cmd(&b, &reserve, 0, None).await), RC);
        assert_eq!(outcome(&cmd(&b, &release, 0, None).await), RC);
    });
    e.stop();
    e.join();
}

#[test]
fn aptpl_keeps_the_registry_across_a_restart() {
    let e = engine(1);
    let dir = std::env::temp_dir().join(format!("ferrite-scsi-aptpl-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("pr.json");
    let uuid = "5a3c1f1e-7d9b-4c55-9a1e-0f0e0d0c0b0a";
    let make = |f: std::path::PathBuf| {
        ferrite_modules::malloc::create(ferrite_modules::malloc::MallocOpts {
            name: Some("pr_aptpl".into()),
            num_blocks: 64,
            block_size: BS,
            uuid: Some(uuid.into()),
            ..Default::default()
        })
        .unwrap();
        let t = ferrite_scsi::Target::new("iqn.2026-01.io.ferrite:aptpl");
        t.add_port(ferrite_scsi::PortInfo { rel_id: 1, group: 1, name: "p1".into(), protocol: Some(5) }).unwrap();
        let mut cfg = ferrite_scsi::LunConfig::new("pr_aptpl");
        cfg.aptpl_file = Some(f);
        t.add_lun(0, ferrite_scsi::Lun::new(cfg).unwrap()).unwrap();
        t
    };
    let t = make(file.clone());
    run(&e, 0, move || async move {
        let (a, b) = (session(&t, 1), session(&t, 2));
        assert_eq!(prout(&a, 0, 0, 0, 0xa, 0x01).await, GOOD);
        assert_eq!(prout(&b, 0, 0, 0, 0xb, 0x01).await, GOOD);
        assert_eq!(prout(&a, 1, 3, 0xa, 0, 0).await, GOOD);
        assert_eq!(prin(&a, 2).await[3] & 1, 1, "PTPL_A");
        drop((a, b));
        t.remove_lun(0);
    });
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.contains("\"initiator\"") && text.contains("\"isid\""), "{text}");
    // The bdev goes and comes back with the same UUID: the reservation is there again.
    let rx = ferrite_bdev::unregister("pr_aptpl", None).unwrap();
    rx.wait().unwrap();
    let t = make(file.clone());
    run(&e, 0, move || async move {
        let (a, b) = (session(&t, 1), session(&t, 2));
        assert_eq!(keys(&prin(&a, 0).await), vec![0xa, 0xb]);
        let r = prin(&b, 1).await;
        assert_eq!((u64::from_be_bytes(r[8..16].try_into().unwrap()), r[21]), (0xa, 3));
        assert!(!read_ok(&b).await && read_ok(&a).await);
    });
    std::fs::remove_dir_all(&dir).unwrap();
    e.stop();
    e.join();
}
