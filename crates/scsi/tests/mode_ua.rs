//! Mode pages (sense, select, changeable and default values, D_SENSE, SWP) and unit
//! attentions: each once per I_T nexus, cleared when reported.

mod common;

use common::*;
use ferrite_scsi::cdb::op;

const BS: u32 = 512;

/// MODE SENSE(6) of `page` with page control `pc`, without block descriptors.
fn sense6(pc: u8, page: u8) -> Vec<u8> {
    vec![op::MODE_SENSE_6, 0x08, pc << 6 | page, 0, 255, 0]
}

#[test]
fn mode_select_changes_what_mode_sense_shows_and_tells_the_other_nexuses() {
    let e = engine(1);
    let t = target("mode_sel", 1024, BS);
    run(&e, 0, move || async move {
        let s1 = session(&t, 1);
        let s2 = session(&t, 2);
        // Changeable: D_SENSE and SWP in the control page.
        let ch = data(&cmd(&s1, &sense6(1, 0x0a), 255, None).await);
        assert_eq!((ch[4], ch[6] & 0x04, ch[8] & 0x08), (0x0a, 0x04, 0x08));
        let cur = data(&cmd(&s1, &sense6(0, 0x0a), 255, None).await);
        assert_eq!(cur[6] & 0x04, 0, "fixed format by default");
        // Set D_SENSE.
        let mut list = vec![0u8; 4];
        list.extend_from_slice(&cur[4..]);
        list[4 + 2] |= 0x04;
        let sel = [op::MODE_SELECT_6, 0x10, 0, 0, list.len() as u8, 0];
        assert_eq!(outcome(&cmd(&s1, &sel, list.len() as u32, Some(&list)).await), GOOD);
        let now = data(&cmd(&s1, &sense6(0, 0x0a), 255, None).await);
        assert_eq!(now[6] & 0x04, 0x04, "the current value changed");
        let def = data(&cmd(&s1, &sense6(2, 0x0a), 255, None).await);
        assert_eq!(def[6] & 0x04, 0, "the default did not");
        // Saved values cannot be asked for.
        assert_eq!(outcome(&cmd(&s1, &sense6(3, 0x0a), 255, None).await), check(5, 0x39, 0));
        // The other nexus gets MODE PARAMETERS CHANGED once, in descriptor format now.
        let r = cmd(&s2, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None).await;
        assert_eq!(outcome(&r), check(6, 0x2a, 0x01));
        assert_eq!(r.sense.as_slice()[0], 0x72);
        assert_eq!(outcome(&cmd(&s2, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None).await), GOOD);
        assert_eq!(outcome(&cmd(&s1, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None).await), GOOD, "not the changer");
        // An error now comes in descriptor format, with the field pointer descriptor.
        let r = cmd(&s1, &cdb10(op::READ_10, 0x20, 0, 1), BS, None).await;
        let sd = r.sense.as_slice();
        assert_eq!((sd[0], sd[1], sd[2], sd[8]), (0x72, 5, 0x24, 0x02));
        // A byte that is not changeable: INVALID FIELD IN PARAMETER LIST at its place.
        list[4 + 3] ^= 0x80;
        let r = cmd(&s1, &sel, list.len() as u32, Some(&list)).await;
        assert_eq!(outcome(&r), check(5, 0x26, 0));
        // SP is refused (nothing is saved).
        let r = cmd(&s1, &[op::MODE_SELECT_6, 0x11, 0, 0, 0, 0], 0, None).await;
        assert_eq!(outcome(&r), check(5, 0x24, 0));
        // SWP: reads pass, writes are DATA PROTECT; WP shows in the header.
        let mut list = vec![0u8; 4];
        list.extend_from_slice(&now[4..]);
        list[4 + 4] |= 0x08;
        assert_eq!(outcome(&cmd(&s1, &sel, list.len() as u32, Some(&list)).await), GOOD);
        let hdr = data(&cmd(&s1, &sense6(0, 0x3f), 255, None).await);
        assert_eq!(hdr[2] & 0x90, 0x90, "WP and DPOFUA");
        assert_eq!(outcome(&cmd(&s1, &cdb10(op::READ_10, 0, 0, 1), BS, None).await), GOOD);
        let r = cmd(&s1, &cdb10(op::WRITE_10, 0, 0, 1), BS, Some(&[0; 512])).await;
        assert_eq!(outcome(&r), check(7, 0x27, 0));
        // MODE SENSE(10) with a long block descriptor.
        let d = data(&cmd(&s1, &[op::MODE_SENSE_10, 0x10, 0x08, 0, 0, 0, 0, 0, 255, 0], 255, None).await);
        assert_eq!((d[4] & 1, u16::from_be_bytes([d[6], d[7]])), (1, 16));
        assert_eq!(u64::from_be_bytes(d[8..16].try_into().unwrap()), 1024);
        // A logical unit reset puts the defaults back and tells everyone.
        assert_eq!(s1.lun_reset(0).await, ferrite_scsi::TmfResponse::Complete);
        for s in [&s1, &s2] {
            let r = cmd(s, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None).await;
            assert_eq!(outcome(&r), check(6, 0x29, 0x03));
            assert_eq!(r.sense.as_slice()[0], 0x70, "D_SENSE is back to its default");
        }
        let r = cmd(&s1, &cdb10(op::WRITE_10, 0, 0, 1), BS, Some(&[0; 512])).await;
        assert_eq!(outcome(&r), GOOD, "SWP is off again");
    });
    e.stop();
    e.join();
}

#[test]
fn unit_attentions_skip_inquiry_and_come_through_request_sense() {
    let e = engine(1);
    let t = target("ua_rs", 1024, BS);
    run(&e, 0, move || async move {
        let s1 = session(&t, 1);
        let s3 = session(&t, 3);
        let tur = [op::TEST_UNIT_READY, 0, 0, 0, 0, 0];
        assert_eq!(outcome(&cmd(&s1, &tur, 0, None).await), GOOD);
        // The bdev grows: CAPACITY DATA HAS CHANGED for every nexus, once.
        ferrite_bdev::lookup("ua_rs").unwrap().notify_resize(4096).unwrap();
        let s2 = session(&t, 2);
        assert_eq!(outcome(&cmd(&s2, &tur, 0, None).await), GOOD, "a nexus made after the change");
        assert_eq!(outcome(&cmd(&s1, &tur, 0, None).await), check(6, 0x2a, 0x09));
        assert_eq!(outcome(&cmd(&s1, &tur, 0, None).await), GOOD, "reported once");
        // INQUIRY and REPORT LUNS do not report it.
        let r = cmd(&s3, &[op::INQUIRY, 0, 0, 0, 96, 0], 96, None).await;
        assert_eq!(outcome(&r), GOOD);
        let r = cmd(&s3, &[op::REPORT_LUNS, 0, 0, 0, 0, 0, 0, 0, 0, 64, 0, 0], 64, None).await;
        assert_eq!(outcome(&r), GOOD);
        // REQUEST SENSE reports it (GOOD status, the condition as sense data) and clears it.
        let r = cmd(&s3, &[op::REQUEST_SENSE, 0, 0, 0, 18, 0], 18, None).await;
        assert_eq!((r.status, ferrite_scsi::sense::parse(&data(&r))), (0, Some((6, 0x2a, 0x09))));
        assert_eq!(outcome(&cmd(&s3, &tur, 0, None).await), GOOD);
        let rc = data(&cmd(&s3, &[op::READ_CAPACITY_10, 0, 0, 0, 0, 0, 0, 0, 0, 0], 8, None).await);
        assert_eq!(u32::from_be_bytes(rc[0..4].try_into().unwrap()), 4095);
        // A LUN added: REPORTED LUNS DATA HAS CHANGED.
        malloc("ua_rs2", 64, BS);
        t.add_lun(1, ferrite_scsi::Lun::new(ferrite_scsi::LunConfig::new("ua_rs2")).unwrap()).unwrap();
        assert_eq!(outcome(&cmd(&s2, &tur, 0, None).await), check(6, 0x3f, 0x0e));
        let r = cmd(&s2, &[op::REPORT_LUNS, 0, 0, 0, 0, 0, 0, 0, 0, 64, 0, 0], 64, None).await;
        assert_eq!(data(&r)[..4], [0, 0, 0, 16]);
        assert_eq!(outcome(&cmd_lun(&s2, 1, &tur, 0, None).await), GOOD);
    });
    e.stop();
    e.join();
}
