//! Every command on a malloc logical unit: data written and read back, the data-in of the
//! informational commands, and the sense of the errors SPC-4 and SBC-3 name.

mod common;

use common::*;
use ferrite_scsi::cdb::op;
use ferrite_scsi::Residual;

const BS: u32 = 512;
const BLOCKS: u64 = 4096;

#[test]
fn reads_and_writes_of_every_size_round_trip() {
    let e = engine(1);
    let t = target("cmd_rw", BLOCKS, BS);
    run(&e, 0, move || async move {
        let s = session(&t, 1);
        let d = pattern(1, 8 * BS as usize);
        // WRITE(6) at 1, READ(10) back.
        let r = cmd(&s, &[op::WRITE_6, 0, 0, 1, 8, 0], 8 * BS, Some(&d)).await;
        assert_eq!(outcome(&r), GOOD);
        let r = cmd(&s, &cdb10(op::READ_10, 0, 1, 8), 8 * BS, None).await;
        assert_eq!((outcome(&r), data(&r)), (GOOD, d.clone()));
        // WRITE(10) with FUA and DPO, READ(6).
        let d2 = pattern(2, 4 * BS as usize);
        let r = cmd(&s, &cdb10(op::WRITE_10, 0x18, 100, 4), 4 * BS, Some(&d2)).await;
        assert_eq!(outcome(&r), GOOD);
        let r = cmd(&s, &[op::READ_6, 0, 0, 100, 4, 0], 4 * BS, None).await;
        assert_eq!(data(&r), d2);
        // WRITE(12), READ(16); WRITE(16), READ(12).
        let r = cmd(&s, &cdb12(op::WRITE_12, 0, 200, 8), 8 * BS, Some(&d)).await;
        assert_eq!(outcome(&r), GOOD);
        let r = cmd(&s, &cdb16(op::READ_16, 0x08, 200, 8), 8 * BS, None).await;
        assert_eq!(data(&r), d);
        let r = cmd(&s, &cdb16(op::WRITE_16, 0, BLOCKS - 4, 4), 4 * BS, Some(&d2)).await;
        assert_eq!(outcome(&r), GOOD);
        let r = cmd(&s, &cdb12(op::READ_12, 0, (BLOCKS - 4) as u32, 4), 4 * BS, None).await;
        assert_eq!(data(&r), d2);
        // READ(6) of 0 blocks is 256.
        let r = cmd(&s, &[op::READ_6, 0, 0, 0, 0, 0], 256 * BS, None).await;
        assert_eq!((outcome(&r), r.data_len), (GOOD, 256 * BS));
        // Zero blocks: GOOD, nothing moved.
        let r = cmd(&s, &cdb10(op::READ_10, 0, 0, 0), 0, None).await;
        assert_eq!((outcome(&r), r.data_len, r.residual), (GOOD, 0, Residual::None));
    });
    e.stop();
    e.join();
}

#[test]
fn range_and_field_errors() {
    let e = engine(1);
    let t = target_with("cmd_err", BLOCKS, BS, |c| c.max_transfer_bytes = 64 << 10);
    run(&e, 0, move || async move {
        let s = session(&t, 1);
        let oob = check(5, 0x21, 0);
        for (lba, n) in [(BLOCKS as u32, 1), (BLOCKS as u32 - 1, 2), (u32::MAX, 1), (BLOCKS as u32 + 1, 0)] {
            let r = cmd(&s, &cdb10(op::READ_10, 0, lba, n), u32::from(n) * BS, None).await;
            assert_eq!(outcome(&r), oob, "read {lba}+{n}");
        }
        let r = cmd(&s, &cdb16(op::WRITE_16, 0, u64::MAX, 1), BS, Some(&[0; 512])).await;
        assert_eq!(outcome(&r), oob);
        // RDPROTECT without protection information: invalid field, pointing at byte 1 bit 7.
        let r = cmd(&s, &cdb10(op::READ_10, 0xe0, 0, 1), BS, None).await;
        assert_eq!(outcome(&r), check(5, 0x24, 0));
        assert_eq!(&r.sense.as_slice()[15..18], &[0xcf, 0, 1], "SKSV, C/D, BPV, bit 7, byte 1");
        // An unknown opcode, and an unknown service action (pointer at byte 1).
        let r = cmd(&s, &[0xc1, 0, 0, 0, 0, 0], 0, None).await;
        assert_eq!(outcome(&r), check(5, 0x20, 0));
        let r = cmd(&s, &[op::SERVICE_ACTION_IN_16, 0x11, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0], 32, None).await;
        assert_eq!(outcome(&r), check(5, 0x24, 0));
        assert_eq!(&r.sense.as_slice()[15..18], &[0xcc, 0, 1]);
        // Beyond the maximum transfer length.
        let r = cmd(&s, &cdb16(op::READ_16, 0, 0, 129), 129 * BS, None).await;
        assert_eq!(outcome(&r), check(5, 0x24, 0));
        assert_eq!(&r.sense.as_slice()[15..18], &[0xc0, 0, 10], "the TRANSFER LENGTH field");
        assert_eq!(outcome(&cmd(&s, &cdb16(op::READ_16, 0, 0, 128), 128 * BS, None).await), GOOD);
        // An unknown LUN.
        let r = cmd_lun(&s, 3, &cdb10(op::READ_10, 0, 0, 1), BS, None).await;
        assert_eq!(outcome(&r), check(5, 0x25, 0));
        let r = cmd_lun(&s, 3, &[op::INQUIRY, 0, 0, 0, 36, 0], 36, None).await;
        assert_eq!((r.status, data(&r)[0]), (0, 0x7f), "peripheral qualifier 011b");
    });
    e.stop();
    e.join();
}

#[test]
fn residuals_follow_the_expected_length() {
    let e = engine(1);
    let t = target("cmd_resid", BLOCKS, BS);
    run(&e, 0, move || async move {
        let s = session(&t, 1);
        let a = vec![b'a'; 2 * BS as usize];
        assert_eq!(outcome(&cmd(&s, &cdb10(op::WRITE_10, 0, 0, 2), 2 * BS, Some(&a)).await), GOOD);
        // Reads: cut at the expected length, or short of it.
        let r = cmd(&s, &cdb10(op::READ_10, 0, 0, 1), 0, None).await;
        assert_eq!((outcome(&r), r.data_len, r.residual), (GOOD, 0, Residual::Over(BS)));
        let r = cmd(&s, &cdb10(op::READ_10, 0, 0, 1), 10000, None).await;
        assert_eq!((r.data_len, r.residual), (BS, Residual::Under(10000 - BS)));
        let r = cmd(&s, &cdb10(op::READ_10, 0, 0, 1), 200, None).await;
        assert_eq!((r.data_len, r.residual), (200, Residual::Over(BS - 200)));
        // Writes: an expected length of whole blocks short of the transfer writes those
        // blocks, GOOD with the rest as overflow (FCP-4's choice (a)).
        let b = vec![b'b'; 2 * BS as usize];
        assert_eq!(s.data_out_len(0, &cdb10(op::WRITE_10, 0, 0, 2), BS), BS, "the transport gathers one block");
        let r = cmd(&s, &cdb10(op::WRITE_10, 0, 0, 2), BS, Some(&b)).await;
        assert_eq!((outcome(&r), r.residual), (GOOD, Residual::Over(BS)));
        let r = cmd(&s, &cdb10(op::READ_10, 0, 0, 2), 2 * BS, None).await;
        let mut want = b[..BS as usize].to_vec();
        want.extend_from_slice(&a[BS as usize..]);
        assert_eq!(data(&r), want, "the first block written, the second not");
        // None expected: nothing written, GOOD, all of it overflow.
        let c = vec![b'c'; BS as usize];
        let r = cmd(&s, &cdb10(op::WRITE_10, 0, 0, 1), 0, Some(&c)).await;
        assert_eq!((outcome(&r), r.residual), (GOOD, Residual::Over(BS)));
        // Part of a block expected: refused whole (choice (b)), nothing written.
        assert_eq!(s.data_out_len(0, &cdb10(op::WRITE_10, 0, 0, 1), 200), 0, "nothing gathered");
        let r = cmd(&s, &cdb10(op::WRITE_10, 0, 0, 1), 200, Some(&c)).await;
        assert_eq!((outcome(&r), r.residual), (check(5, 0x0e, 0x03), Residual::Over(BS - 200)));
        let r = cmd(&s, &cdb10(op::READ_10, 0, 0, 2), 2 * BS, None).await;
        assert_eq!(data(&r), want, "nothing written by either");
        // More expected than the transfer: written, underflow.
        let mut t = ferrite_scsi::Task::new(0, &cdb10(op::WRITE_10, 0, 0, 1), 10000);
        let n = s.data_out_len(0, &cdb10(op::WRITE_10, 0, 0, 1), 10000);
        assert_eq!(n, BS, "the transport gathers the transfer, not the expected length");
        let mut buf = ferrite_reactor::alloc_buf(n as usize);
        buf.fill(b'b');
        t = t.with_data(buf);
        let r = s.execute(t, 1).await;
        assert_eq!((outcome(&r), r.residual), (GOOD, Residual::Under(10000 - BS)));
        // Allocation lengths cut without a residual against an equal expected length.
        let r = cmd(&s, &[op::MODE_SENSE_6, 0, 0x3f, 0, 4, 0], 4, None).await;
        assert_eq!((r.data_len, r.residual), (4, Residual::None));
        let r = cmd(&s, &[op::MODE_SENSE_6, 0, 0x3f, 0, 255, 0], 255, None).await;
        assert!(matches!(r.residual, Residual::Under(_)));
    });
    e.stop();
    e.join();
}

#[test]
fn inquiry_and_capacity() {
    let e = engine(1);
    let t = target("cmd_inq", BLOCKS, BS);
    run(&e, 0, move || async move {
        let s = session(&t, 1);
        let r = cmd(&s, &[op::INQUIRY, 0, 0, 1, 4, 0], 260, None).await;
        let d = data(&r);
        assert_eq!((d.len(), d[0], d[2], d[3] & 0x0f, usize::from(d[4]) + 5), (96, 0, 6, 2, 96));
        assert_eq!(&d[8..16], b"FERRITE ");
        // EVPD 0 with a page: invalid field.
        let r = cmd(&s, &[op::INQUIRY, 0, 1, 1, 0, 0], 256, None).await;
        assert_eq!(outcome(&r), check(5, 0x24, 0));
        // Every page listed reads.
        let r = cmd(&s, &[op::INQUIRY, 1, 0, 0, 255, 0], 255, None).await;
        let pages = data(&r)[4..].to_vec();
        assert_eq!(pages, vec![0x00, 0x80, 0x83, 0xb0, 0xb1, 0xb2]);
        for p in pages {
            let r = cmd(&s, &[op::INQUIRY, 1, p, 0, 255, 0], 255, None).await;
            let d = data(&r);
            assert_eq!((outcome(&r), d[1]), (GOOD, p));
            assert_eq!(usize::from(u16::from_be_bytes([d[2], d[3]])) + 4, d.len(), "page {p:#x} length");
        }
        let r = cmd(&s, &[op::INQUIRY, 1, 0xc0, 0, 255, 0], 255, None).await;
        assert_eq!(outcome(&r), check(5, 0x24, 0));
        // Serial number is the bdev's name; block limits; provisioning.
        let r = cmd(&s, &[op::INQUIRY, 1, 0x80, 0, 255, 0], 255, None).await;
        assert_eq!(&data(&r)[4..], b"cmd_inq");
        let bl = data(&cmd(&s, &[op::INQUIRY, 1, 0xb0, 0, 255, 0], 255, None).await);
        assert_eq!((bl[3], bl[4] & 1, bl[5]), (0x3c, 1, 255), "WSNZ, compare and write length");
        assert_eq!(u32::from_be_bytes(bl[8..12].try_into().unwrap()), (8 << 20) / BS);
        let lbp = data(&cmd(&s, &[op::INQUIRY, 1, 0xb2, 0, 255, 0], 255, None).await);
        assert_eq!(lbp[5] & 0xe4, 0xe4, "LBPU, LBPWS, LBPWS10, LBPRZ");
        // READ CAPACITY.
        let r = cmd(&s, &[op::READ_CAPACITY_10, 0, 0, 0, 0, 0, 0, 0, 0, 0], 8, None).await;
        assert_eq!(data(&r), [(BLOCKS as u32 - 1).to_be_bytes(), BS.to_be_bytes()].concat());
        let mut rc16 = vec![op::SERVICE_ACTION_IN_16, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0];
        let d = data(&cmd(&s, &rc16, 32, None).await);
        assert_eq!(u64::from_be_bytes(d[0..8].try_into().unwrap()), BLOCKS - 1);
        assert_eq!(d[14] & 0xc0, 0xc0, "LBPME, LBPRZ");
        rc16[13] = 5;
        assert_eq!(data(&cmd(&s, &rc16, 5, None).await).len(), 5, "cut at the allocation length");
        // An LBA without PMI: invalid field at byte 2.
        let r = cmd(&s, &[op::READ_CAPACITY_10, 0, 0, 0, 0, 1, 0, 0, 0, 0], 8, None).await;
        assert_eq!(outcome(&r), check(5, 0x24, 0));
    });
    e.stop();
    e.join();
}

#[test]
fn verify_compare_and_write_and_write_and_verify() {
    let e = engine(1);
    let t = target("cmd_verify", BLOCKS, BS);
    run(&e, 0, move || async move {
        let s = session(&t, 1);
        let d = pattern(3, 4 * BS as usize);
        assert_eq!(outcome(&cmd(&s, &cdb10(op::WRITE_10, 0, 10, 4), 4 * BS, Some(&d)).await), GOOD);
        // VERIFY BYTCHK 1: equal, then different at byte 700.
        assert_eq!(outcome(&cmd(&s, &cdb10(op::VERIFY_10, 0x02, 10, 4), 4 * BS, Some(&d)).await), GOOD);
        let mut bad = d.clone();
        bad[700] ^= 0xff;
        let r = cmd(&s, &cdb16(op::VERIFY_16, 0x02, 10, 4), 4 * BS, Some(&bad)).await;
        assert_eq!(outcome(&r), check(0x0e, 0x1d, 0));
        assert_eq!(r.sense.as_slice()[0], 0xf0, "VALID");
        assert_eq!(u32::from_be_bytes(r.sense.as_slice()[3..7].try_into().unwrap()), 700, "INFORMATION");
        // BYTCHK 0 (medium only) passes whatever the data; BYTCHK 3 compares each block with one.
        assert_eq!(outcome(&cmd(&s, &cdb12(op::VERIFY_12, 0, 10, 4), 0, None).await), GOOD);
        let one = vec![9u8; BS as usize];
        let all = vec![9u8; 3 * BS as usize];
        assert_eq!(outcome(&cmd(&s, &cdb10(op::WRITE_10, 0, 20, 3), 3 * BS, Some(&all)).await), GOOD);
        assert_eq!(outcome(&cmd(&s, &cdb10(op::VERIFY_10, 0x06, 20, 3), BS, Some(&one)).await), GOOD);
        assert_eq!(outcome(&cmd(&s, &cdb10(op::VERIFY_10, 0x04, 20, 3), 0, None).await), check(5, 0x24, 0));
        // COMPARE AND WRITE: match then write, then a miscompare with its offset.
        let new = pattern(4, 2 * BS as usize);
        let mut cw = cdb16(op::COMPARE_AND_WRITE, 0, 10, 0);
        cw[13] = 2;
        let both = [&d[..2 * BS as usize], &new[..]].concat();
        assert_eq!(outcome(&cmd(&s, &cw, 4 * BS, Some(&both)).await), GOOD);
        let r = cmd(&s, &cdb10(op::READ_10, 0, 10, 2), 2 * BS, None).await;
        assert_eq!(data(&r), new);
        let r = cmd(&s, &cw, 4 * BS, Some(&both)).await;
        assert_eq!(outcome(&r), check(0x0e, 0x1d, 0));
        let first_diff = d.iter().zip(&new).position(|(a, b)| a != b).unwrap() as u32;
        assert_eq!(u32::from_be_bytes(r.sense.as_slice()[3..7].try_into().unwrap()), first_diff);
        // The data-out of a COMPARE AND WRITE must be exactly twice the blocks.
        let r = cmd(&s, &cw, 5 * BS, Some(&[both.clone(), vec![0; 512]].concat())).await;
        assert_eq!(outcome(&r), check(5, 0x24, 0), "its NUMBER OF LOGICAL BLOCKS is the invalid field");
        assert_eq!(r.sense.as_slice()[15..18], [0xc0, 0, 13], "field pointer: byte 13");
        // 256 blocks do not fit the 8-bit field: 0 blocks with data is refused, not run.
        let mut zero = cw.clone();
        zero[13] = 0;
        let r = cmd(&s, &zero, 4 * BS, Some(&both)).await;
        assert_eq!(outcome(&r), check(5, 0x24, 0));
        let r = cmd(&s, &cdb10(op::READ_10, 0, 10, 2), 2 * BS, None).await;
        assert_eq!(data(&r), new, "nothing written");
        // WRITE AND VERIFY, with and without BYTCHK.
        let w = pattern(5, 2 * BS as usize);
        assert_eq!(outcome(&cmd(&s, &cdb10(op::WRITE_AND_VERIFY_10, 0x02, 30, 2), 2 * BS, Some(&w)).await), GOOD);
        assert_eq!(outcome(&cmd(&s, &cdb16(op::WRITE_AND_VERIFY_16, 0, 32, 2), 2 * BS, Some(&w)).await), GOOD);
        let r = cmd(&s, &cdb10(op::READ_10, 0, 30, 4), 4 * BS, None).await;
        assert_eq!(data(&r), [w.clone(), w].concat());
    });
    e.stop();
    e.join();
}

#[test]
fn write_same_unmap_and_lba_status() {
    let e = engine(1);
    let t = target("cmd_ws", BLOCKS, BS);
    run(&e, 0, move || async move {
        let s = session(&t, 1);
        // A pattern over 300 blocks (more than one chunk is not needed at 512 B: 2048 a chunk).
        let p = pattern(6, BS as usize);
        assert_eq!(outcome(&cmd(&s, &cdb10(op::WRITE_SAME_10, 0, 5, 300), BS, Some(&p)).await), GOOD);
        let r = cmd(&s, &cdb10(op::READ_10, 0, 5, 300), 300 * BS, None).await;
        assert!(data(&r).chunks(BS as usize).all(|c| c == p.as_slice()));
        // With UNMAP and zeroes: the blocks read as zeroes (LBPRZ).
        let z = vec![0u8; BS as usize];
        assert_eq!(outcome(&cmd(&s, &cdb16(op::WRITE_SAME_16, 0x08, 5, 100), BS, Some(&z)).await), GOOD);
        let r = cmd(&s, &cdb10(op::READ_10, 0, 5, 101), 101 * BS, None).await;
        let d = data(&r);
        assert!(d[..100 * BS as usize].iter().all(|&b| b == 0));
        assert_eq!(&d[100 * BS as usize..], p.as_slice());
        // NDOB: zeroes without data-out.
        assert_eq!(outcome(&cmd(&s, &cdb16(op::WRITE_SAME_16, 0x01, 105, 10), 0, None).await), GOOD);
        let r = cmd(&s, &cdb10(op::READ_10, 0, 105, 10), 10 * BS, None).await;
        assert!(data(&r).iter().all(|&b| b == 0));
        // Zero blocks (WSNZ), ANCHOR without UNMAP, past the end.
        assert_eq!(outcome(&cmd(&s, &cdb10(op::WRITE_SAME_10, 0, 5, 0), BS, Some(&p)).await), check(5, 0x24, 0));
        assert_eq!(outcome(&cmd(&s, &cdb10(op::WRITE_SAME_10, 0x10, 5, 1), BS, Some(&p)).await), check(5, 0x24, 0));
        let r = cmd(&s, &cdb10(op::WRITE_SAME_10, 0, BLOCKS as u32 - 1, 2), BS, Some(&p)).await;
        assert_eq!(outcome(&r), check(5, 0x21, 0));
        // A data-out of two blocks for WRITE SAME is refused.
        let r = cmd(&s, &cdb10(op::WRITE_SAME_10, 0, 5, 1), 2 * BS, Some(&[p.clone(), p.clone()].concat())).await;
        assert_eq!(outcome(&r).1, 5);
        // UNMAP with many descriptors.
        let full = pattern(7, 64 * BS as usize);
        assert_eq!(outcome(&cmd(&s, &cdb10(op::WRITE_10, 0, 1000, 64), 64 * BS, Some(&full)).await), GOOD);
        let mut list = vec![0u8; 8];
        for i in 0..32u64 {
            let mut desc = [0u8; 16];
            desc[..8].copy_from_slice(&(1000 + 2 * i).to_be_bytes());
            desc[8..12].copy_from_slice(&1u32.to_be_bytes());
            list.extend_from_slice(&desc);
        }
        let n = list.len();
        list[0..2].copy_from_slice(&((n - 2) as u16).to_be_bytes());
        list[2..4].copy_from_slice(&((n - 8) as u16).to_be_bytes());
        let mut un = vec![op::UNMAP, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        un[7..9].copy_from_slice(&(n as u16).to_be_bytes());
        assert_eq!(outcome(&cmd(&s, &un, n as u32, Some(&list)).await), GOOD);
        let d = data(&cmd(&s, &cdb10(op::READ_10, 0, 1000, 64), 64 * BS, None).await);
        for (i, blk) in d.chunks(BS as usize).enumerate() {
            if i % 2 == 0 {
                assert!(blk.iter().all(|&b| b == 0), "block {i} unmapped");
            } else {
                assert_eq!(blk, &full[i * BS as usize..(i + 1) * BS as usize]);
            }
        }
        // A descriptor past the end: nothing unmapped, LBA out of range.
        list[8..16].copy_from_slice(&(BLOCKS).to_be_bytes());
        assert_eq!(outcome(&cmd(&s, &un, n as u32, Some(&list)).await), check(5, 0x21, 0));
        // A parameter list shorter than its header.
        let short = [op::UNMAP, 0, 0, 0, 0, 0, 0, 0, 4, 0];
        assert_eq!(outcome(&cmd(&s, &short, 4, Some(&[0; 4])).await), check(5, 0x1a, 0));
        // GET LBA STATUS: mapped to the end (malloc cannot tell), and past the end.
        let mut gls = vec![op::SERVICE_ACTION_IN_16, 0x12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 24, 0, 0];
        gls[2..10].copy_from_slice(&100u64.to_be_bytes());
        let d = data(&cmd(&s, &gls, 24, None).await);
        assert_eq!(u64::from_be_bytes(d[8..16].try_into().unwrap()), 100);
        assert_eq!(u32::from_be_bytes(d[16..20].try_into().unwrap()), (BLOCKS - 100) as u32);
        gls[2..10].copy_from_slice(&(BLOCKS + 1).to_be_bytes());
        assert_eq!(outcome(&cmd(&s, &gls, 24, None).await), check(5, 0x21, 0));
    });
    e.stop();
    e.join();
}

#[test]
fn cache_prefetch_unit_state_and_reports() {
    let e = engine(1);
    let t = target("cmd_misc", BLOCKS, BS);
    run(&e, 0, move || async move {
        let s = session(&t, 1);
        assert_eq!(outcome(&cmd(&s, &cdb10(op::SYNCHRONIZE_CACHE_10, 0, 0, 0), 0, None).await), GOOD);
        assert_eq!(outcome(&cmd(&s, &cdb16(op::SYNCHRONIZE_CACHE_16, 0x02, 10, 10), 0, None).await), GOOD);
        let r = cmd(&s, &cdb16(op::SYNCHRONIZE_CACHE_16, 0, BLOCKS, 1), 0, None).await;
        assert_eq!(outcome(&r), check(5, 0x21, 0));
        assert_eq!(outcome(&cmd(&s, &cdb10(op::PRE_FETCH_10, 0x02, 0, 1), 0, None).await), GOOD);
        assert_eq!(outcome(&cmd(&s, &cdb16(op::PRE_FETCH_16, 0, BLOCKS, 1), 0, None).await), check(5, 0x21, 0));
        // STOP, then medium access is not ready until START.
        assert_eq!(outcome(&cmd(&s, &[op::START_STOP_UNIT, 0, 0, 0, 0, 0], 0, None).await), GOOD);
        assert_eq!(outcome(&cmd(&s, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None).await), check(2, 4, 2));
        assert_eq!(outcome(&cmd(&s, &cdb10(op::READ_10, 0, 0, 1), BS, None).await), check(2, 4, 2));
        let r = cmd(&s, &[op::REQUEST_SENSE, 0, 0, 0, 252, 0], 252, None).await;
        assert_eq!((r.status, ferrite_scsi::sense::parse(&data(&r))), (0, Some((2, 4, 2))));
        assert_eq!(outcome(&cmd(&s, &[op::START_STOP_UNIT, 1, 0, 0, 1, 0], 0, None).await), GOOD);
        assert_eq!(outcome(&cmd(&s, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], 0, None).await), GOOD);
        // A reserved power condition.
        assert_eq!(outcome(&cmd(&s, &[op::START_STOP_UNIT, 0, 0, 0, 0x50, 0], 0, None).await), check(5, 0x24, 0));
        // REQUEST SENSE without a condition: NO SENSE, fixed or descriptor as asked.
        let r = cmd(&s, &[op::REQUEST_SENSE, 1, 0, 0, 252, 0], 252, None).await;
        assert_eq!(data(&r)[..4], [0x72, 0, 0, 0]);
        // REPORT LUNS.
        let mut rl = vec![op::REPORT_LUNS, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        rl[9] = 255;
        let d = data(&cmd(&s, &rl, 255, None).await);
        assert_eq!(d, [vec![0, 0, 0, 8, 0, 0, 0, 0], vec![0; 8]].concat());
        rl[9] = 8;
        assert_eq!(outcome(&cmd(&s, &rl, 8, None).await), check(5, 0x24, 0), "less than 16 bytes");
        // REPORT SUPPORTED OPERATION CODES: all, then each one's usage data.
        let mut rsoc = vec![op::MAINTENANCE_IN, 0x0c, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0];
        let all = data(&cmd(&s, &rsoc, 0xffff, None).await);
        let n = u32::from_be_bytes(all[0..4].try_into().unwrap()) as usize;
        assert_eq!(n + 4, all.len());
        let descs: Vec<&[u8]> = all[4..].chunks(8).collect();
        assert!(descs.iter().any(|d| d[0] == op::READ_16));
        for d in &descs {
            let servactv = d[5] & 1 != 0;
            rsoc[2] = if servactv { 2 } else { 1 };
            rsoc[3] = d[0];
            rsoc[4..6].copy_from_slice(&d[2..4]);
            let one = data(&cmd(&s, &rsoc, 0xffff, None).await);
            assert_eq!((one[1] & 7, one[4]), (3, d[0]), "opcode {:#x}", d[0]);
            assert_eq!(
                usize::from(u16::from_be_bytes([one[2], one[3]])),
                usize::from(u16::from_be_bytes([d[6], d[7]]))
            );
            rsoc[2] = if servactv { 1 } else { 2 };
            assert_eq!(outcome(&cmd(&s, &rsoc, 0xffff, None).await), check(5, 0x24, 0));
        }
        // With timeouts descriptors (RCTD): 20 bytes a command.
        rsoc[2] = 0x80;
        let t = data(&cmd(&s, &rsoc, 0xffff, None).await);
        assert_eq!(t.len() - 4, descs.len() * 20);
        // REPORT SUPPORTED TASK MANAGEMENT FUNCTIONS.
        let d = data(&cmd(&s, &[op::MAINTENANCE_IN, 0x0d, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0], 16, None).await);
        assert_eq!(d, vec![0xda, 0, 0, 0]);
        // REPORT TARGET PORT GROUPS: one group, active/optimized, both ports.
        let d = data(&cmd(&s, &[op::MAINTENANCE_IN, 0x0a, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0], 256, None).await);
        assert_eq!(d, vec![0, 0, 0, 16, 0x80, 1, 0, 1, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 2]);
    });
    e.stop();
    e.join();
}

#[test]
fn a_bdev_without_unmap_is_fully_provisioned() {
    use ferrite_modules::null::{self, NullOpts};
    let e = engine(1);
    null::create(NullOpts {
        name: "cmd_null".into(),
        num_blocks: BLOCKS,
        block_size: 4096,
        physical_block_size: None,
        uuid: None,
        preferred_unmap_granularity: 0,
        preferred_unmap_alignment: 0,
    })
    .unwrap();
    let t = ferrite_scsi::Target::new("iqn.2026-01.io.ferrite:null");
    t.add_port(ferrite_scsi::PortInfo { rel_id: 1, group: 1, name: "p1".into(), protocol: None }).unwrap();
    t.add_lun(0, ferrite_scsi::Lun::new(ferrite_scsi::LunConfig::new("cmd_null")).unwrap()).unwrap();
    run(&e, 0, move || async move {
        let s = session(&t, 1);
        let pages = data(&cmd(&s, &[op::INQUIRY, 1, 0, 0, 255, 0], 255, None).await);
        assert_eq!(&pages[4..], &[0x00, 0x80, 0x83, 0xb0, 0xb1], "no provisioning page");
        assert_eq!(outcome(&cmd(&s, &[op::INQUIRY, 1, 0xb2, 0, 255, 0], 255, None).await), check(5, 0x24, 0));
        let rc16 = [op::SERVICE_ACTION_IN_16, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0];
        let d = data(&cmd(&s, &rc16, 32, None).await);
        assert_eq!((d[14], u32::from_be_bytes(d[8..12].try_into().unwrap())), (0, 4096), "LBPME 0");
        let bl = data(&cmd(&s, &[op::INQUIRY, 1, 0xb0, 0, 255, 0], 255, None).await);
        assert_eq!(&bl[20..28], &[0; 8], "no unmap counts without UNMAP");
        let un = [op::UNMAP, 0, 0, 0, 0, 0, 0, 0, 24, 0];
        assert_eq!(outcome(&cmd(&s, &un, 24, Some(&[0; 24])).await), check(5, 0x20, 0));
        let rsoc = [op::MAINTENANCE_IN, 0x0c, 0x01, op::UNMAP, 0, 0, 0, 0, 0xff, 0xff, 0, 0];
        assert_eq!(data(&cmd(&s, &rsoc, 0xffff, None).await)[1] & 7, 1, "UNMAP reported as not supported");
        let ws = cdb16(op::WRITE_SAME_16, 0x08, 0, 4);
        assert_eq!(outcome(&cmd(&s, &ws, 4096, Some(&[0; 4096])).await), check(5, 0x24, 0));
        // Without UNMAP it writes (zeroes, here: the null bdev's write zeroes).
        assert_eq!(outcome(&cmd(&s, &cdb16(op::WRITE_SAME_16, 0, 0, 4), 4096, Some(&[0; 4096])).await), GOOD);
    });
    e.stop();
    e.join();
}
